//! Memory nodes: children of the root with `device_type = "memory"`, their `numa-node-id` and
//! the whole 4 KiB frames of their `reg` ranges.
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::{Props, Visit};
use super::value::{self, Cells};
use crate::addr::{PAGE_SIZE, PhysAddr, PhysRange};
use crate::topology::NodeId;

/// The node a memory node names, or `None` without `numa-node-id`.
pub(super) fn node_id(dtb: &[u8], p: &Props<'_>) -> Result<Option<NodeId>, FdtError> {
    p.node_id.map(|v| value::node_id(dtb, v)).transpose()
}

/// Calls `f` with the frames of each `reg` range of the memory node `v`, rounded inwards to
/// whole frames; a range that holds no whole frame is dropped.
/// Only the parts inside `usable` count.
pub(super) fn for_each_range(
    dtb: &[u8],
    v: &Visit<'_>,
    p: &Props<'_>,
    cells: Cells,
    usable: UsableRange,
    mut f: impl FnMut(PhysRange),
) -> Result<(), FdtError> {
    let reg = p.reg.ok_or(FdtError::BadProperty { at: v.at, len: 0 })?;
    value::reg(dtb, reg, cells, |e| {
        let end = e.base.checked_add(e.size).ok_or(FdtError::BadRange {
            at: e.at,
            base: e.base,
            size: e.size,
        })?;
        usable.clip(e.base, end, |base, end| {
            if let Some(range) = whole_frames(base, end) {
                f(range);
            }
        });
        Ok(())
    })
}

/// What `/chosen`'s `linux,usable-memory-range` leaves of memory, as Linux's
/// `early_init_dt_check_for_usable_mem_range` applies it: memory inside `cap` (all memory
/// without one), and memory inside `extra`. Byte ranges `(base, end)`.
///
/// Linux's `memblock_add` of the second entry adds it even where no memory node has memory;
/// numaframe cannot tell which node such memory is on, and keeps to memory of memory nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct UsableRange {
    cap: Option<(u64, u64)>,
    extra: Option<(u64, u64)>,
}

impl UsableRange {
    /// The property's value, read in the root's `cells`: up to two (address, size) entries.
    pub(super) fn read(dtb: &[u8], value: Option<&[u8]>, cells: Cells) -> Result<Self, FdtError> {
        let mut u = UsableRange::default();
        // Linux ignores a value whose length in bytes is not a multiple of the cells (as it is
        // written), and caps nothing with an empty one.
        let cells_per_entry = (cells.address + cells.size) as usize;
        let Some(v) = value.filter(|v| !v.is_empty() && v.len().is_multiple_of(cells_per_entry))
        else {
            return Ok(u);
        };
        let mut i = 0;
        value::reg(dtb, v, cells, |e| {
            let window = (e.size > 0).then(|| (e.base, e.base.saturating_add(e.size)));
            match i {
                0 => u.cap = window,
                1 => u.extra = window,
                _ => {}
            }
            i += 1;
            Ok(())
        })?;
        Ok(u)
    }

    /// Calls `f` with the parts of `base..end` that stay memory, in address order.
    fn clip(&self, base: u64, end: u64, mut f: impl FnMut(u64, u64)) {
        let Some(cap) = self.cap else {
            f(base, end);
            return;
        };
        let mut windows = [Some(cap), self.extra];
        // The union of the two windows, as one or two disjoint ones in address order.
        if let [Some(a), Some(b)] = windows {
            let (a, b) = if a.0 <= b.0 { (a, b) } else { (b, a) };
            windows = if b.0 <= a.1 {
                [Some((a.0, a.1.max(b.1))), None]
            } else {
                [Some(a), Some(b)]
            };
        }
        for (lo, hi) in windows.into_iter().flatten() {
            let (lo, hi) = (lo.max(base), hi.min(end));
            if lo < hi {
                f(lo, hi);
            }
        }
    }
}

/// The frames wholly inside `base..end`, or `None` if there is none.
fn whole_frames(base: u64, end: u64) -> Option<PhysRange> {
    let start = base.checked_next_multiple_of(PAGE_SIZE)?;
    let end = end - end % PAGE_SIZE;
    if start >= end {
        return None;
    }
    PhysRange::from_bytes(PhysAddr::new(start), end - start)
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::super::test_tree::{G, Out, error_of, machine};
    use super::super::{FdtError, parse};
    use super::*;

    #[test]
    fn ranges_round_inwards() {
        let dtb = machine(
            &[(Some(0), G + 100, 2 * PAGE_SIZE), (Some(0), 2 * G, 100)],
            &[],
            None,
            None,
        );
        let mut o = Out::new(1, 2, 0);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        let r = t.ranges();
        assert_eq!(r.len(), 1, "the 100-byte range holds no whole frame");
        assert_eq!(r[0].range.frames(), 1);
        assert_eq!(r[0].range.start().addr().get(), G + PAGE_SIZE);
    }

    #[test]
    fn linux_usable_memory_is_the_memory_of_a_memory_node() {
        // Linux's `early_init_dt_scan_memory`: `reg = linux,usable-memory`, and only if that is
        // absent `reg = reg`; memblock gets the ranges of that one property.
        use super::super::test_tree::{TestNode, blob, cells, string};
        let node = |usable: Option<&[u32]>| {
            let mut m = TestNode::new("memory@40000000")
                .prop("device_type", string("memory"))
                .prop("reg", cells(&[0, 0x4000_0000, 0, 0x4000_0000]));
            if let Some(u) = usable {
                m = m.prop("linux,usable-memory", cells(u));
            }
            TestNode::new("")
                .prop("#address-cells", cells(&[2]))
                .prop("#size-cells", cells(&[2]))
                .child(m)
        };
        let ranges = |root: &TestNode| {
            let mut o = Out::new(1, 4, 0);
            let mut t = o.topo();
            parse(&blob(root, &[]), &mut t).unwrap();
            t.ranges()
                .iter()
                .map(|r| (r.range.start().addr().get(), r.range.bytes()))
                .collect::<std::vec::Vec<_>>()
        };
        assert_eq!(ranges(&node(None)), [(0x4000_0000, 0x4000_0000)]);
        assert_eq!(
            ranges(&node(Some(&[
                0,
                0x5000_0000,
                0,
                0x100_0000,
                0,
                0x6000_0000,
                0,
                0x20_0000
            ]))),
            [(0x5000_0000, 0x100_0000), (0x6000_0000, 0x20_0000)],
            "linux,usable-memory replaces reg"
        );
    }

    #[test]
    fn a_root_without_cells_lays_out_reg_in_one_address_and_one_size_cell() {
        // Linux's `early_init_dt_scan_root`: without `#address-cells` or `#size-cells` in the
        // root, `dt_root_addr_cells = OF_ROOT_NODE_ADDR_CELLS_DEFAULT` (1 but on SPARC) and
        // `dt_root_size_cells = OF_ROOT_NODE_SIZE_CELLS_DEFAULT` (1); memory `reg` entries are
        // read in those cells.
        use super::super::test_tree::{TestNode, blob, cells, string};
        let root = TestNode::new("").child(
            TestNode::new("memory@40000000")
                .prop("device_type", string("memory"))
                .prop(
                    "reg",
                    cells(&[
                        0x4000_0000,
                        0x1000_0000,
                        0x6000_0000,
                        0x1000_0000,
                        0x8000_0000,
                        0x1000_0000,
                    ]),
                ),
        );
        let mut o = Out::new(1, 4, 0);
        let mut t = o.topo();
        parse(&blob(&root, &[]), &mut t).unwrap();
        let got: std::vec::Vec<_> = t
            .ranges()
            .iter()
            .map(|r| (r.range.start().addr().get(), r.range.bytes()))
            .collect();
        assert_eq!(
            got,
            [
                (0x4000_0000, 0x1000_0000),
                (0x6000_0000, 0x1000_0000),
                (0x8000_0000, 0x1000_0000)
            ]
        );
    }

    #[test]
    fn chosen_linux_usable_memory_range_caps_memory_as_linux_does() {
        // Linux's `early_init_dt_check_for_usable_mem_range` (after the memory nodes are read):
        // `/chosen`'s `linux,usable-memory-range` holds up to two (address, size) entries in the
        // root's cells; `memblock_cap_memory_range(rgn[0])` drops all memory outside the first
        // (nothing if its size is 0), then `memblock_add(rgn[1])` if the second has a size.
        use super::super::test_tree::{TestNode, blob, cells, string};
        let tree = |range: &[u32]| {
            TestNode::new("")
                .prop("#address-cells", cells(&[2]))
                .prop("#size-cells", cells(&[2]))
                .child(TestNode::new("chosen").prop("linux,usable-memory-range", cells(range)))
                .child(
                    TestNode::new("memory@40000000")
                        .prop("device_type", string("memory"))
                        .prop("reg", cells(&[0, 0x4000_0000, 0, 0x4000_0000])),
                )
        };
        let ranges = |root: &TestNode| {
            let mut o = Out::new(1, 4, 0);
            let mut t = o.topo();
            parse(&blob(root, &[]), &mut t).unwrap();
            let mut r: std::vec::Vec<_> = t
                .ranges()
                .iter()
                .map(|r| (r.range.start().addr().get(), r.range.bytes()))
                .collect();
            r.sort();
            r
        };
        // Linux's memblock after the cap, as (base, size), whole frames inside.
        assert_eq!(
            ranges(&tree(&[0, 0x6000_0000, 0, 0x1000_0000])),
            [(0x6000_0000, 0x1000_0000)]
        );
        assert_eq!(
            ranges(&tree(&[
                0,
                0x6000_0000,
                0,
                0x1000_0000,
                0,
                0x4100_0000,
                0,
                0x100_0000
            ])),
            [(0x4100_0000, 0x100_0000), (0x6000_0000, 0x1000_0000)]
        );
        assert_eq!(
            ranges(&tree(&[0, 0x6000_0000, 0, 0])),
            [(0x4000_0000, 0x4000_0000)],
            "a first range of size 0 caps nothing"
        );
        // `if (!prop || (len % (dt_root_addr_cells + dt_root_size_cells))) return;`: a value
        // whose length in bytes is not a multiple of the cells is ignored.
        let narrow = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[1]))
            .child(TestNode::new("chosen").prop(
                "linux,usable-memory-range",
                cells(&[0, 0x6000_0000, 0, 0x1000_0000]),
            ))
            .child(
                TestNode::new("memory@40000000")
                    .prop("device_type", string("memory"))
                    .prop("reg", cells(&[0, 0x4000_0000, 0x4000_0000])),
            );
        assert_eq!(ranges(&narrow), [(0x4000_0000, 0x4000_0000)]);
    }

    #[test]
    fn memory_node_errors() {
        assert!(matches!(
            error_of(&machine(
                &[(Some(0), G, G), (None, 2 * G, G)],
                &[],
                None,
                None
            )),
            FdtError::MissingNodeId { .. }
        ));
        assert!(matches!(
            error_of(&machine(&[(Some(5000), G, G)], &[], None, None)),
            FdtError::NodeIdOutOfRange { id: 5000, .. }
        ));
        assert!(matches!(
            error_of(&machine(&[(Some(0), u64::MAX, G)], &[], None, None)),
            FdtError::BadRange { .. }
        ));
        assert!(matches!(
            error_of(&machine(&[], &[Some(0)], None, None)),
            FdtError::NoMemory
        ));
    }
}
