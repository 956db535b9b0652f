//! The distance map: the first node of the tree with `compatible = "numa-distance-map-v1"`,
//! whatever its `status`, whose `distance-matrix` holds `(from, to, distance)` triples, read with Linux's
//! defaults and mirroring (see the [module docs](super)).
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::{Tree, Visit};
use super::value::{self, be32, offset_in};
use crate::topology::{LOCAL_DISTANCE, NodeId, NodeMask, valid_firmware_distance};

/// Linux's default distance between two different nodes (`REMOTE_DISTANCE`).
pub const REMOTE_DISTANCE: u8 = 20;

/// Depth below which Linux's `unflatten_dt_nodes` keeps no node (`FDT_MAX_DEPTH - 1`, the root
/// at depth 0).
const MAX_DEPTH: usize = 63;

/// The `distance-matrix` of the distance map: the first node compatible with
/// `numa-distance-map-v1` in the order Linux's `of_find_compatible_node` walks the whole tree
/// (the root, then each child before its children, in tree order), whatever its status.
/// `None` without one; `Some(Err)` if the map has no `distance-matrix`.
///
/// # Errors
/// A malformed node met before the map.
pub(super) fn find<'d>(
    tree: &Tree<'d>,
    v: &Visit<'d>,
    depth: usize,
) -> Result<Option<Result<&'d [u8], FdtError>>, FdtError> {
    if let Some(matrix) = map_matrix(tree, v)? {
        return Ok(Some(matrix));
    }
    let mut found = None;
    if depth + 1 < MAX_DEPTH {
        tree.children(v, |child| {
            if found.is_none() {
                found = find(tree, &child, depth + 1)?;
            }
            Ok(())
        })?;
    }
    Ok(found)
}

/// `find` for `v` alone, out of line so that the recursion's frames hold no properties.
#[inline(never)]
fn map_matrix<'d>(
    tree: &Tree<'d>,
    v: &Visit<'d>,
) -> Result<Option<Result<&'d [u8], FdtError>>, FdtError> {
    let p = tree.props(v)?;
    Ok(
        value::compatible_with(p.compatible, "numa-distance-map-v1").then(|| {
            p.distance_matrix
                .ok_or(FdtError::BadProperty { at: v.at, len: 0 })
        }),
    )
}

/// The largest node id the triples of `matrix` name.
///
/// # Errors
/// As [`fill`], which it checks the same way.
pub(super) fn max_node(dtb: &[u8], matrix: &[u8]) -> Result<usize, FdtError> {
    let mut max = 0;
    for_each_triple(dtb, matrix, |t| {
        max = max.max(t.from.index()).max(t.to.index());
    })?;
    Ok(max)
}

/// The nodes that come first in a triple of `matrix`: those Linux's
/// `of_numa_parse_distance_map_v1` marks parsed, and so possible.
///
/// # Errors
/// As [`fill`], which it checks the same way.
pub(super) fn sources(dtb: &[u8], matrix: &[u8]) -> Result<NodeMask, FdtError> {
    let mut from = NodeMask::EMPTY;
    for_each_triple(dtb, matrix, |t| {
        from.insert(t.from);
    })?;
    Ok(from)
}

/// Writes the distance table of `n` nodes into `dist` (row-major, `n * n` entries): the
/// defaults, then the triples of `matrix`.
///
/// # Errors
/// [`FdtError::BadProperty`] for a matrix that is not whole triples,
/// [`FdtError::NodeIdOutOfRange`] and [`FdtError::BadDistance`] for a bad triple.
pub(super) fn fill(
    dtb: &[u8],
    matrix: Option<&[u8]>,
    dist: &mut [u8],
    n: usize,
) -> Result<(), FdtError> {
    for (i, d) in dist.iter_mut().enumerate() {
        *d = if i / n == i % n {
            LOCAL_DISTANCE
        } else {
            REMOTE_DISTANCE
        };
    }
    let Some(m) = matrix else {
        return Ok(());
    };
    for_each_triple(dtb, m, |t| {
        let (a, b) = (t.from.index(), t.to.index());
        dist[a * n + b] = t.distance;
        if b > a {
            dist[b * n + a] = t.distance;
        }
    })
}

/// One `(from, to, distance)` entry of a `distance-matrix`, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Triple {
    from: NodeId,
    to: NodeId,
    distance: u8,
}

/// Calls `f` with each triple of a `distance-matrix`, stopping at the first bad one.
fn for_each_triple(dtb: &[u8], m: &[u8], mut f: impl FnMut(Triple)) -> Result<(), FdtError> {
    if m.is_empty() || !m.len().is_multiple_of(12) {
        return Err(FdtError::BadProperty {
            at: offset_in(dtb, m),
            len: m.len(),
        });
    }
    for t in m.chunks_exact(12) {
        let at = offset_in(dtb, t);
        let [a, b, d] = [0, 4, 8].map(|i| be32(t, i).unwrap_or(0));
        let id = |id: u32, off: usize| {
            NodeId::try_new(id as usize).ok_or(FdtError::NodeIdOutOfRange { at: at + off, id })
        };
        let (from, to) = (id(a, 0)?, id(b, 4)?);
        let valid = u8::try_from(d)
            .ok()
            .filter(|&v| valid_firmware_distance(from, to, v));
        let Some(distance) = valid else {
            return Err(FdtError::BadDistance {
                at,
                from: a,
                to: b,
                distance: d,
            });
        };
        f(Triple { from, to, distance });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_tree::{G, Out, error_of, machine};
    use super::super::{FdtError, parse};

    #[test]
    fn one_sided_matrix_is_mirrored_and_later_entries_win() {
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(1)],
            Some(&[(0, 0, 10), (0, 1, 15), (1, 1, 10)]),
            None,
        );
        let mut o = Out::new(2, 2, 2);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.distances(), &[10, 15, 15, 10]);
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(1)],
            Some(&[(0, 1, 15), (1, 0, 25)]),
            None,
        );
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.distances(), &[10, 15, 25, 10]);
    }

    #[test]
    fn the_distance_map_is_read_whatever_its_status() {
        // Linux's `of_numa_parse_distance_map` finds the map with
        // `of_find_compatible_node(NULL, NULL, "numa-distance-map-v1")` (drivers/of/of_numa.c),
        // whose match (`__of_device_is_compatible`, drivers/of/base.c) looks at no `status`:
        // a map marked "disabled" or "fail" sets the distances all the same.
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
        for status in ["disabled", "fail", "reserved"] {
            let root = root()
                .child(memory(1 << 30, 1 << 30, Some(0)))
                .child(memory(2 << 30, 1 << 30, Some(1)))
                .child(
                    TestNode::new("distance-map")
                        .prop("compatible", string("numa-distance-map-v1"))
                        .prop("status", string(status))
                        .prop("distance-matrix", cells(&[0, 1, 15])),
                );
            let dtb = blob(&root, &[]);
            let mut o = Out::new(2, 2, 0);
            let mut t = o.topo();
            parse(&dtb, &mut t).unwrap();
            assert_eq!(t.distances(), &[10, 15, 15, 10], "status {status:?}");
        }
    }

    #[test]
    fn the_distance_map_is_the_first_compatible_node_anywhere_in_the_tree() {
        // Linux's `of_numa_parse_distance_map` takes
        // `of_find_compatible_node(NULL, NULL, "numa-distance-map-v1")` (drivers/of/of_numa.c):
        // the first compatible node of the whole tree, walked from the root parents before
        // children in tree order (`for_each_of_allnodes_from`, `__of_find_all_nodes`,
        // drivers/of/base.c), not only among the root's children. A map below `/soc` comes
        // before a later child of the root.
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
        let map = |d: u32| {
            TestNode::new("distance-map")
                .prop("compatible", string("numa-distance-map-v1"))
                .prop("distance-matrix", cells(&[0, 1, d]))
        };
        let tree = |later: bool| {
            let mut root = root()
                .child(memory(1 << 30, 1 << 30, Some(0)))
                .child(memory(2 << 30, 1 << 30, Some(1)))
                .child(TestNode::new("soc").child(TestNode::new("bus").child(map(15))));
            if later {
                root = root.child(map(25));
            }
            blob(&root, &[])
        };
        for later in [false, true] {
            let dtb = tree(later);
            let mut o = Out::new(2, 2, 0);
            let mut t = o.topo();
            parse(&dtb, &mut t).unwrap();
            assert_eq!(t.distances(), &[10, 15, 15, 10], "a later map: {later}");
        }
        // `unflatten_dt_nodes` (drivers/of/fdt.c) keeps no node at depth `FDT_MAX_DEPTH - 1`
        // (63, the root at 0) or deeper: a map there is not found.
        for (depth, d) in [(62, 15), (63, 20)] {
            let mut node = map(15);
            for _ in 1..depth {
                node = TestNode::new("bus").child(node);
            }
            let root = root()
                .child(memory(1 << 30, 1 << 30, Some(0)))
                .child(memory(2 << 30, 1 << 30, Some(1)))
                .child(node);
            let dtb = blob(&root, &[]);
            let mut o = Out::new(2, 2, 0);
            let mut t = o.topo();
            parse(&dtb, &mut t).unwrap();
            assert_eq!(t.distances(), &[10, d, d, 10], "a map at depth {depth}");
        }
    }

    #[test]
    fn the_distance_maps_compatible_string_matches_in_any_case() {
        // Linux's `__of_device_is_compatible` (drivers/of/base.c) compares each string of
        // `compatible` with `of_compat_cmp`, which is `strcasecmp` (include/linux/of.h; only
        // sparc overrides it): `of_find_compatible_node` finds "NUMA-Distance-Map-V1" too.
        use super::super::test_tree::{TestNode, blob, cells, memory, root, string};
        let root = root()
            .child(memory(1 << 30, 1 << 30, Some(0)))
            .child(memory(2 << 30, 1 << 30, Some(1)))
            .child(
                TestNode::new("distance-map")
                    .prop("compatible", string("NUMA-Distance-Map-V1"))
                    .prop("distance-matrix", cells(&[0, 1, 15])),
            );
        let dtb = blob(&root, &[]);
        let mut o = Out::new(2, 2, 0);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.distances(), &[10, 15, 15, 10]);
    }

    #[test]
    fn distances_break_no_slit_rule() {
        assert!(matches!(
            error_of(&machine(&[(Some(0), G, G)], &[], Some(&[(0, 0, 12)]), None)),
            FdtError::BadDistance { distance: 12, .. }
        ));
        assert!(matches!(
            error_of(&machine(
                &[(Some(0), G, G), (Some(1), 2 * G, G)],
                &[],
                Some(&[(0, 1, 300)]),
                None,
            )),
            FdtError::BadDistance { distance: 300, .. }
        ));
    }

    #[test]
    fn the_map_is_checked_as_linux_checks_a_firmware_table() {
        for d in 0..=256u32 {
            for (a, b) in [(0, 1), (1, 1)] {
                let dtb = machine(
                    &[(Some(0), G, G), (Some(1), 2 * G, G)],
                    &[],
                    Some(&[(a, b, d)]),
                    None,
                );
                let mut o = Out::new(2, 2, 0);
                let fdt_ok = parse(&dtb, &mut o.topo()).is_ok();
                // `of_numa_parse_distance_map`: 10 from a node to itself, more than 10 to
                // another, in a byte.
                let linux_ok = d <= 255 && if a == b { d == 10 } else { d > 10 };
                assert_eq!(fdt_ok, linux_ok, "({a}, {b}, {d})");
            }
        }
    }
}
