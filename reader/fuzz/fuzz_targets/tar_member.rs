//! `parse_member` over arbitrary buffers and positions, walking from member to member as the
//! readers do: every member it returns lies inside the buffer and moves forward by whole blocks,
//! so a walk always ends; anything else is an error, never a panic.
//!
//! Input: two bytes choosing the start position (values from 0xFF00 up pick positions near
//! `usize::MAX`, to try overflow), then the buffer.
#![no_main]

use imgpack_reader::webdataset::{parse_member, BLOCK};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((choice, buf)) = data.split_first_chunk::<2>() else { return };
    let choice = u16::from_le_bytes(*choice);
    let mut pos =
        if choice >= 0xFF00 { usize::MAX - usize::from(choice & 0xFF) * 256 } else { usize::from(choice) };
    let range = buf.as_ptr_range();
    while let Ok(member) = parse_member(buf, pos) {
        let data = member.data.as_ptr_range();
        assert!(range.start <= data.start && data.end <= range.end, "member data outside the buffer");
        assert!(member.next > pos, "no progress at {pos}");
        assert_eq!((member.next - pos) % BLOCK as usize, 0, "next is not whole blocks further");
        assert!(member.name.len() <= 100);
        pos = member.next;
    }
});
