//! Packing one plan on many machines: the plan is split into parts ([`split`]), each machine
//! packs its part, and `pack merge` joins the parts into one dataset.

pub mod merge;
pub mod part;
pub mod split;
