//! Memory reservations: the header's reservation block (`/memreserve/`) and the children of
//! `/reserved-memory`.
#![deny(unsafe_code)]

use super::error::{Block, FdtError};
use super::tree::Tree;
use super::value::{self, Cells, be64};
use crate::addr::PhysAddr;

/// Calls `f` with each memory reservation of `dtb`: the header's reservation block
/// (`/memreserve/`), the `reg` ranges of the children of `/reserved-memory` and a kdump
/// kernel's ELF core header (`/chosen`'s `linux,elfcorehdr`), as Linux's
/// `early_init_fdt_scan_reserved_mem` reserves them. A platform keeps these out of the ranges it
/// gives the allocator.
///
/// # Errors
/// An [`FdtError`] for a malformed tree or reservation.
pub fn for_each_reservation(dtb: &[u8], mut f: impl FnMut(PhysAddr, u64)) -> Result<(), FdtError> {
    let tree = Tree::open(dtb)?;
    let bad_block = FdtError::BadBlock {
        block: Block::Reservations,
        offset: tree.header.off_rsvmap as u32,
        size: 0,
    };
    let mut at = tree.header.off_rsvmap;
    loop {
        let (Some(base), Some(size)) = (be64(dtb, at), be64(dtb, at + 8)) else {
            return Err(bad_block);
        };
        if at + 16 > tree.header.total_size {
            return Err(bad_block);
        }
        // Linux's `early_init_fdt_scan_reserved_mem` stops at the first entry of size 0, where
        // the specification's block ends with one that is all zeros.
        if size == 0 {
            break;
        }
        f(PhysAddr::new(base), size);
        at += 16;
    }
    let root = tree.root();
    let rp = tree.props(&root)?;
    let root_cells = Cells::read(dtb, rp.address_cells, rp.size_cells)?;
    let mut chosen = false;
    tree.children(&root, |child| {
        // `/chosen` as Linux's `early_init_dt_scan_chosen` finds it: the first child so named,
        // with or without a unit address. Its `linux,elfcorehdr` (a kdump kernel's ELF core
        // header) is one (address, size) in the root's cells, which `fdt_reserve_elfcorehdr`
        // reserves unless its size is 0.
        if child.name == "chosen" && !chosen {
            chosen = true;
            // Linux ignores a value shorter than `dt_root_addr_cells + dt_root_size_cells`
            // (bytes compared with cells, as it is written).
            let cells = (root_cells.address + root_cells.size) as usize;
            if let Some(v) = tree.property(&child, "linux,elfcorehdr")?
                && v.len() >= cells
            {
                let entry = ((root_cells.address + root_cells.size) * 4) as usize;
                let first = v.get(..entry).ok_or(FdtError::BadProperty {
                    at: value::offset_in(dtb, v),
                    len: v.len(),
                })?;
                value::reg(dtb, first, root_cells, |e| {
                    if e.size > 0 {
                        f(PhysAddr::new(e.base), e.size);
                    }
                    Ok(())
                })?;
            }
            return Ok(());
        }
        if child.name != "reserved-memory" {
            return Ok(());
        }
        let p = tree.props(&child)?;
        let cells = Cells::read(dtb, p.address_cells, p.size_cells)?;
        tree.children(&child, |region| {
            let rp = tree.props(&region)?;
            if let (Some(reg), true) = (rp.reg, value::available(rp.status)) {
                value::reg(dtb, reg, cells, |e| {
                    f(PhysAddr::new(e.base), e.size);
                    Ok(())
                })?;
            }
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::super::test_tree::{TestNode, blob, cells};
    use super::*;

    #[test]
    fn reservations() {
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .child(
                TestNode::new("reserved-memory")
                    .prop("#address-cells", cells(&[2]))
                    .prop("#size-cells", cells(&[1]))
                    .child(TestNode::new("fw@0").prop("reg", cells(&[0, 0x5000_0000, 0x2000]))),
            );
        let dtb = blob(&root, &[(0x4000_0000, 0x1000), (0x4800_0000, 0x3000)]);
        let mut seen = Vec::new();
        for_each_reservation(&dtb, |a, s| seen.push((a.get(), s))).unwrap();
        assert_eq!(
            seen,
            [
                (0x4000_0000, 0x1000),
                (0x4800_0000, 0x3000),
                (0x5000_0000, 0x2000)
            ]
        );
    }

    #[test]
    fn the_reservation_block_ends_at_the_first_entry_of_size_0() {
        // Linux's `early_init_fdt_scan_reserved_mem`: `for (n = 0; ; n++) {
        // fdt_get_mem_rsv(fdt, n, &base, &size); if (!size) break; memblock_reserve(base, size);
        // }`: an entry of size 0 ends the block whatever its address, and one at address 0 with
        // a size is a reservation.
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]));
        let dtb = blob(
            &root,
            &[(0, 0x1000), (0x4800_0000, 0), (0x5000_0000, 0x2000)],
        );
        let mut seen = Vec::new();
        for_each_reservation(&dtb, |a, s| seen.push((a.get(), s))).unwrap();
        assert_eq!(seen, [(0, 0x1000)]);
    }

    #[test]
    fn the_kdump_elf_core_header_is_a_reservation() {
        // Linux's `early_init_dt_check_for_elfcorehdr` reads `/chosen`'s `linux,elfcorehdr` as
        // one (address, size) in the root's cells, and `early_init_fdt_scan_reserved_mem` ends
        // with `fdt_reserve_elfcorehdr`: `memblock_reserve(elfcorehdr_addr, elfcorehdr_size)`
        // unless the size is 0.
        let root = |header: &[u32]| {
            TestNode::new("")
                .prop("#address-cells", cells(&[2]))
                .prop("#size-cells", cells(&[1]))
                .child(TestNode::new("chosen").prop("linux,elfcorehdr", cells(header)))
        };
        let seen = |root: &TestNode| {
            let mut seen = Vec::new();
            for_each_reservation(&blob(root, &[(0x4000_0000, 0x1000)]), |a, s| {
                if s > 0 {
                    seen.push((a.get(), s));
                }
            })
            .unwrap();
            seen
        };
        assert_eq!(
            seen(&root(&[1, 0x2000_0000, 0x1_0000])),
            [(0x4000_0000, 0x1000), (0x1_2000_0000, 0x1_0000)]
        );
        assert_eq!(
            seen(&root(&[1, 0x2000_0000, 0])),
            [(0x4000_0000, 0x1000)],
            "a header of size 0 is not reserved"
        );
        // `if (!prop || (len < (dt_root_addr_cells + dt_root_size_cells))) return;`
        assert_eq!(
            seen(&root(&[])),
            [(0x4000_0000, 0x1000)],
            "an empty value is ignored"
        );
    }
}
