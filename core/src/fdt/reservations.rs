//! Memory reservations: the header's reservation block (`/memreserve/`) and the children of
//! `/reserved-memory`.
#![deny(unsafe_code)]

use super::error::{Block, FdtError};
use super::tree::Tree;
use super::value::{self, Cells, be64};
use crate::addr::PhysAddr;

/// Calls `f` with each memory reservation of `dtb`, as Linux's
/// `early_init_fdt_scan_reserved_mem` reserves them: the header's reservation block
/// (`/memreserve/`, up to its first entry of size 0), the `reg` ranges of the available children
/// of `/reserved-memory` (none if its `#address-cells` or `#size-cells` is not the root's or it
/// has no `ranges`, as `fdt_scan_reserved_mem` ignores it then) and a kdump kernel's ELF core
/// header (`/chosen`'s `linux,elfcorehdr`). A platform keeps these out of the ranges it gives the
/// allocator. Regions that name only a `size` are placed by Linux's allocator, and are not
/// reported.
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
    // `/reserved-memory` as Linux's `fdt_scan_reserved_mem` finds it (`fdt_path_offset`: the
    // first child so named, with or without a unit address, whatever its status).
    if let Some(node) = tree.child(&root, "reserved-memory")? {
        // `__reserved_mem_check_root`: Linux ignores the node unless its `#size-cells` and
        // `#address-cells` are the root's and it has `ranges`.
        let p = tree.props(&node)?;
        let first = |v: Option<&[u8]>| v.and_then(|v| value::be32(v, 0));
        if first(p.size_cells) == Some(root_cells.size)
            && first(p.address_cells) == Some(root_cells.address)
            && tree.property(&node, "ranges")?.is_some()
        {
            let entry = ((root_cells.address + root_cells.size) * 4) as usize;
            tree.children(&node, |region| {
                let rp = tree.props(&region)?;
                // `__reserved_mem_reserve_reg`: a `reg` that is not whole entries skips the
                // region, and an entry of size 0 reserves nothing.
                if let (Some(reg), true) = (rp.reg, value::available(rp.status))
                    && !reg.is_empty()
                    && reg.len().is_multiple_of(entry)
                {
                    reserve_entries(dtb, reg, root_cells, &mut f)?;
                }
                Ok(())
            })?;
        }
    }
    // `/chosen` as Linux's `early_init_dt_scan_chosen` finds it. Its `linux,elfcorehdr` (a
    // kdump kernel's ELF core header) is one (address, size) in the root's cells, which
    // `fdt_reserve_elfcorehdr` reserves unless its size is 0.
    if let Some(chosen) = tree.child(&root, "chosen")? {
        // Linux ignores a value shorter than `dt_root_addr_cells + dt_root_size_cells` (bytes
        // compared with cells, as it is written).
        let cells = (root_cells.address + root_cells.size) as usize;
        if let Some(v) = tree.property(&chosen, "linux,elfcorehdr")?
            && v.len() >= cells
        {
            let first = v.get(..cells * 4).ok_or(FdtError::BadProperty {
                at: value::offset_in(dtb, v),
                len: v.len(),
            })?;
            reserve_entries(dtb, first, root_cells, &mut f)?;
        }
    }
    Ok(())
}

/// Calls `f` with each (address, size) entry of `value`, in `cells`, whose size is not 0: Linux
/// reserves nothing for one of size 0.
fn reserve_entries(
    dtb: &[u8],
    value: &[u8],
    cells: Cells,
    f: &mut impl FnMut(PhysAddr, u64),
) -> Result<(), FdtError> {
    value::reg(dtb, value, cells, |e| {
        if e.size > 0 {
            f(PhysAddr::new(e.base), e.size);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::super::test_tree::{TestNode, blob, cells, string};
    use super::*;

    #[test]
    fn reservations() {
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .child(
                TestNode::new("reserved-memory")
                    .prop("#address-cells", cells(&[2]))
                    .prop("#size-cells", cells(&[2]))
                    .prop("ranges", Vec::new())
                    .child(TestNode::new("fw@0").prop("reg", cells(&[0, 0x5000_0000, 0, 0x2000]))),
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
    fn reserved_memory_is_read_as_linux_reads_it() {
        // Linux's `fdt_scan_reserved_mem`: `/reserved-memory` is `fdt_path_offset`'s first child
        // of the root so named (with or without a unit address). `__reserved_mem_check_root`
        // ignores all of it unless its `#size-cells` and `#address-cells` are there and equal to
        // the root's, and it has `ranges`. Each available child's `reg` is read in the root's
        // cells (`__reserved_mem_reserve_reg`): a length that is not whole entries skips that
        // child alone, and an entry of size 0 reserves nothing.
        let region = |name, reg: &[u32]| TestNode::new(name).prop("reg", cells(reg));
        let reserved = |address: Option<u32>, size: Option<u32>, ranges: bool| {
            let mut r = TestNode::new("reserved-memory");
            if let Some(a) = address {
                r = r.prop("#address-cells", cells(&[a]));
            }
            if let Some(s) = size {
                r = r.prop("#size-cells", cells(&[s]));
            }
            if ranges {
                r = r.prop("ranges", Vec::new());
            }
            r.child(region("a@50000000", &[0x5000_0000, 0x2000]))
        };
        let root = |r: TestNode| {
            TestNode::new("")
                .prop("#address-cells", cells(&[1]))
                .prop("#size-cells", cells(&[1]))
                .child(r)
        };
        let seen = |root: &TestNode| {
            let mut seen = Vec::new();
            for_each_reservation(&blob(root, &[]), |a, s| seen.push((a.get(), s))).unwrap();
            seen
        };
        let a = (0x5000_0000, 0x2000);
        assert_eq!(seen(&root(reserved(Some(1), Some(1), true))), [a]);
        assert_eq!(
            seen(&root(reserved(Some(1), Some(1), false))),
            [],
            "no ranges"
        );
        assert_eq!(
            seen(&root(reserved(None, Some(1), true))),
            [],
            "no #address-cells"
        );
        assert_eq!(
            seen(&root(reserved(Some(1), None, true))),
            [],
            "no #size-cells"
        );
        assert_eq!(
            seen(&root(reserved(Some(2), Some(1), true))),
            [],
            "#address-cells other than the root's"
        );
        let full = root(
            reserved(Some(1), Some(1), true)
                .child(region("b@60000000", &[0x6000_0000, 0, 0x6100_0000, 0x1000]))
                .child(region("bad@0", &[0x7000_0000, 0x1000, 0x7100_0000]))
                .child(region("off@0", &[0x7200_0000, 0x1000]).prop("status", string("disabled")))
                .child(region("c@73000000", &[0x7300_0000, 0x1000])),
        )
        .child(
            TestNode::new("reserved-memory@1")
                .prop("#address-cells", cells(&[1]))
                .prop("#size-cells", cells(&[1]))
                .prop("ranges", Vec::new())
                .child(region("second@0", &[0x7400_0000, 0x1000])),
        );
        assert_eq!(
            seen(&full),
            [a, (0x6100_0000, 0x1000), (0x7300_0000, 0x1000)],
            "entries of size 0, a child whose reg is not whole entries, a disabled child and \
             a second /reserved-memory reserve nothing"
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
