//! The header of a flattened device tree: its magic, version, and the bounds of its blocks, all
//! checked before the `fdt` crate reads a byte of the structure block.
#![deny(unsafe_code)]

use super::error::{Block, FdtError};
use super::value::be32;

/// The FDT magic number.
const MAGIC: u32 = 0xd00d_feed;
/// Bytes in a version-17 header.
const HEADER_BYTES: usize = 40;
const FDT_END: u32 = 9;

/// The header fields the reader uses, after validation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Header {
    /// `totalsize`, at most the length of the input.
    pub(super) total_size: usize,
    /// `off_mem_rsvmap`: 8-byte aligned, with room for one entry inside `total_size`.
    pub(super) off_rsvmap: usize,
    /// `boot_cpuid_phys`.
    pub(super) boot_cpuid: u32,
}

impl Header {
    /// Checks the header and that every block lies inside `totalsize` bytes of `dtb`.
    pub(super) fn read(dtb: &[u8]) -> Result<Header, FdtError> {
        let word = |i: usize| {
            be32(dtb, i * 4).ok_or(FdtError::Truncated {
                needed: HEADER_BYTES,
                len: dtb.len(),
            })
        };
        let magic = word(0)?;
        if magic != MAGIC {
            return Err(FdtError::BadMagic { magic });
        }
        if dtb.len() < HEADER_BYTES {
            return Err(FdtError::Truncated {
                needed: HEADER_BYTES,
                len: dtb.len(),
            });
        }
        let [
            total,
            off_struct,
            off_strings,
            off_rsvmap,
            version,
            last_comp,
            boot_cpuid,
        ] = [1, 2, 3, 4, 5, 6, 7].map(|i| word(i).unwrap_or(0));
        let [size_strings, size_struct] = [8, 9].map(|i| word(i).unwrap_or(0));
        if version < 17 || last_comp > 17 {
            return Err(FdtError::UnsupportedVersion {
                version,
                last_compatible: last_comp,
            });
        }
        let total_size = total as usize;
        if total_size > dtb.len() || total_size < HEADER_BYTES {
            return Err(FdtError::Truncated {
                needed: total_size.max(HEADER_BYTES),
                len: dtb.len(),
            });
        }
        let inside = |off: u32, size: u32| {
            (off as usize) >= HEADER_BYTES
                && (off as usize)
                    .checked_add(size as usize)
                    .is_some_and(|end| end <= total_size)
        };
        // The structure block is word aligned, whole words, and ends with END: the parser
        // relies on the last word being there.
        let bad_struct = FdtError::BadBlock {
            block: Block::Structure,
            offset: off_struct,
            size: size_struct,
        };
        if !inside(off_struct, size_struct)
            || off_struct % 4 != 0
            || size_struct % 4 != 0
            || size_struct < 8
        {
            return Err(bad_struct);
        }
        if be32(dtb, (off_struct + size_struct - 4) as usize) != Some(FDT_END) {
            return Err(bad_struct);
        }
        if !inside(off_strings, size_strings) {
            return Err(FdtError::BadBlock {
                block: Block::Strings,
                offset: off_strings,
                size: size_strings,
            });
        }
        if !inside(off_rsvmap, 16) || off_rsvmap % 8 != 0 {
            return Err(FdtError::BadBlock {
                block: Block::Reservations,
                offset: off_rsvmap,
                size: 0,
            });
        }
        Ok(Header {
            total_size,
            off_rsvmap: off_rsvmap as usize,
            boot_cpuid,
        })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::super::parse;
    use super::super::test_tree::{Out, amd};
    use super::*;

    #[test]
    fn header_errors() {
        let mut o = Out::new(4, 8, 8);
        let mut check = |dtb: &[u8], want: fn(&FdtError) -> bool| {
            let e = parse(dtb, &mut o.topo()).unwrap_err();
            assert!(want(&e), "{e:?}");
            let _ = std::format!("{e}");
        };
        check(&[], |e| matches!(e, FdtError::Truncated { .. }));
        check(&[0; 64], |e| matches!(e, FdtError::BadMagic { magic: 0 }));
        let good = amd();
        check(&good[..good.len() - 1], |e| {
            matches!(e, FdtError::Truncated { .. })
        });
        let mut v16 = good.clone();
        v16[20..24].copy_from_slice(&16u32.to_be_bytes());
        check(&v16, |e| {
            matches!(e, FdtError::UnsupportedVersion { version: 16, .. })
        });
        let mut far = good.clone();
        far[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        check(&far, |e| {
            matches!(
                e,
                FdtError::BadBlock {
                    block: Block::Strings,
                    ..
                }
            )
        });
    }
}
