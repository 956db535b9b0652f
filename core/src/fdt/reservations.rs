//! Memory reservations: the header's reservation block (`/memreserve/`) and the children of
//! `/reserved-memory`.
#![deny(unsafe_code)]

use super::error::{Block, FdtError};
use super::tree::Tree;
use super::value::{self, Cells, be64};
use crate::addr::PhysAddr;

/// Calls `f` with each memory reservation of `dtb`: the header's reservation block
/// (`/memreserve/`) and the `reg` ranges of the children of `/reserved-memory`. A platform
/// keeps these out of the ranges it gives the allocator.
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
        if base == 0 && size == 0 {
            break;
        }
        f(PhysAddr::new(base), size);
        at += 16;
    }
    let root = tree.root();
    tree.children(&root, |child| {
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
}
