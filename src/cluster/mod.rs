//! Packing one plan on many machines: the plan is split into parts ([`split`]), each machine
//! packs its part, and `pack merge` joins the parts into one dataset. The plan, the tree it lists
//! and the parts to merge may be in an object store ([`crate::source::plan::stored`],
//! [`merge`]), for machines that share no volume.

pub mod merge;
pub mod part;
pub mod split;
