//! The walk over the structure block, through the `fdt` crate's fallible parser: nodes, their
//! children, and the properties the reader looks at.
#![deny(unsafe_code)]

use ::fdt::nodes::{AsNode, Node};
use ::fdt::parsing::unaligned::UnalignedParser;
use ::fdt::parsing::{NoPanic, ParseError};

use super::error::{FdtError, Malformed};
use super::header::Header;
use super::value::{be32, position_in};

/// The parser mode: byte-granular (a tree may sit anywhere) and fallible (never panics).
type Mode<'d> = (UnalignedParser<'d>, NoPanic);
type DtNode<'d> = Node<'d, Mode<'d>>;

/// Our error for a complaint of the `fdt` crate about the node at `at`.
fn malformed(e: ::fdt::FdtError, at: usize) -> FdtError {
    let kind = match e {
        ::fdt::FdtError::ParseError(p) => match p {
            ParseError::InvalidTokenValue => Malformed::BadToken,
            ParseError::UnexpectedToken => Malformed::UnexpectedToken,
            ParseError::UnexpectedEndOfData => Malformed::Truncated,
            ParseError::InvalidCStrValue => Malformed::BadName,
            _ => Malformed::Other,
        },
        ::fdt::FdtError::InvalidNodeName => Malformed::BadName,
        _ => Malformed::Other,
    };
    FdtError::Malformed { at, kind }
}

/// The properties numaframe reads, from one pass over a node's properties.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Props<'d> {
    pub(super) device_type: Option<&'d [u8]>,
    pub(super) status: Option<&'d [u8]>,
    pub(super) compatible: Option<&'d [u8]>,
    pub(super) reg: Option<&'d [u8]>,
    /// A memory node's `linux,usable-memory`, which Linux reads instead of `reg` when present.
    pub(super) usable_memory: Option<&'d [u8]>,
    pub(super) node_id: Option<&'d [u8]>,
    pub(super) address_cells: Option<&'d [u8]>,
    pub(super) size_cells: Option<&'d [u8]>,
    pub(super) distance_matrix: Option<&'d [u8]>,
    pub(super) method: Option<&'d [u8]>,
}

/// One node of the tree, its offset and name.
#[derive(Clone, Copy)]
pub(super) struct Visit<'d> {
    node: DtNode<'d>,
    /// Offset of the node's name in the tree.
    pub(super) at: usize,
    /// The name without its unit address.
    pub(super) name: &'d str,
}

/// A tree whose header has been checked, open at its root.
pub(super) struct Tree<'d> {
    /// The whole input.
    pub(super) dtb: &'d [u8],
    pub(super) header: Header,
    root: DtNode<'d>,
    root_at: usize,
}

impl<'d> Tree<'d> {
    /// Checks the header of `dtb` and opens its structure block.
    pub(super) fn open(dtb: &'d [u8]) -> Result<Tree<'d>, FdtError> {
        let header = Header::read(dtb)?;
        let data = &dtb[..header.total_size];
        let root_at = be32(dtb, 8).unwrap_or(0) as usize;
        let fdt = ::fdt::Fdt::new_unaligned_fallible(data).map_err(|e| malformed(e, root_at))?;
        let root = fdt.root().map_err(|e| malformed(e, root_at))?.as_node();
        Ok(Tree {
            dtb,
            header,
            root,
            root_at,
        })
    }

    /// The root node.
    pub(super) fn root(&self) -> Visit<'d> {
        Visit {
            node: self.root,
            at: self.root_at,
            name: "",
        }
    }

    /// The properties of `v` that the reader uses.
    pub(super) fn props(&self, v: &Visit<'d>) -> Result<Props<'d>, FdtError> {
        let mut p = Props::default();
        let list = v.node.properties().map_err(|e| malformed(e, v.at))?;
        for prop in list.iter() {
            let prop = prop.map_err(|e| malformed(e, v.at))?;
            let slot = match prop.name {
                "device_type" => &mut p.device_type,
                "status" => &mut p.status,
                "compatible" => &mut p.compatible,
                "reg" => &mut p.reg,
                "linux,usable-memory" => &mut p.usable_memory,
                "numa-node-id" => &mut p.node_id,
                "#address-cells" => &mut p.address_cells,
                "#size-cells" => &mut p.size_cells,
                "distance-matrix" => &mut p.distance_matrix,
                "method" => &mut p.method,
                _ => continue,
            };
            // The first occurrence wins, as in libfdt's lookups.
            slot.get_or_insert(prop.value);
        }
        Ok(p)
    }

    /// The value of the property `name` of `v` (the first, if it repeats), or `None`.
    pub(super) fn property(&self, v: &Visit<'d>, name: &str) -> Result<Option<&'d [u8]>, FdtError> {
        let list = v.node.properties().map_err(|e| malformed(e, v.at))?;
        for prop in list.iter() {
            let prop = prop.map_err(|e| malformed(e, v.at))?;
            if prop.name == name {
                return Ok(Some(prop.value));
            }
        }
        Ok(None)
    }

    /// The first child of `parent` that a path component `part` names, as libfdt's
    /// `fdt_path_offset` finds it: by its base name whatever its unit address, or by both when
    /// `part` has an `@`. `None` without one.
    pub(super) fn child(
        &self,
        parent: &Visit<'d>,
        part: &str,
    ) -> Result<Option<Visit<'d>>, FdtError> {
        let mut found = None;
        self.children(parent, |child| {
            if found.is_some() {
                return Ok(());
            }
            let hit = match part.split_once('@') {
                Some(named) => self.unit_address(&child)?.map(|u| (child.name, u)) == Some(named),
                None => child.name == part,
            };
            if hit {
                found = Some(child);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Calls `f` with each child of `parent`, stopping at the first error.
    pub(super) fn children(
        &self,
        parent: &Visit<'d>,
        mut f: impl FnMut(Visit<'d>) -> Result<(), FdtError>,
    ) -> Result<(), FdtError> {
        let kids = parent
            .node
            .children()
            .map_err(|e| malformed(e, parent.at))?;
        for child in kids.iter() {
            let node = child.map_err(|e| malformed(e, parent.at))?;
            let name = node.name().map_err(|e| malformed(e, parent.at))?.name;
            // The crate names a node whose name is empty "/", a string of its own and not in
            // the tree, so that it has no offset to report; only the root may be nameless.
            let at = position_in(self.dtb, name.as_bytes()).ok_or(FdtError::Malformed {
                at: parent.at,
                kind: Malformed::UnnamedNode,
            })?;
            f(Visit { node, at, name })?;
        }
        Ok(())
    }

    /// The unit address of `v` (`1000` in `memory@1000`), if it has one.
    pub(super) fn unit_address(&self, v: &Visit<'d>) -> Result<Option<&'d str>, FdtError> {
        let full = v.node.name().map_err(|e| malformed(e, v.at))?;
        Ok(full.unit_address)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_tree::{Out, TestNode, blob, cells, string};
    use super::super::{FdtError, Malformed, for_each_reservation, parse, string_property};
    use super::be32;

    #[test]
    fn a_nameless_node_below_the_root_is_malformed_at_its_parent() {
        // The second memory node has an empty name and no `numa-node-id`: the error must name
        // a byte of the tree (the root's, as the name has no place of its own), not the
        // address of the crate's stand-in name.
        let memory = |name, base: u32| {
            TestNode::new(name)
                .prop("device_type", string("memory"))
                .prop("reg", cells(&[base, 1 << 20]))
        };
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[1]))
            .prop("#size-cells", cells(&[1]))
            .child(memory("memory@0", 0).prop("numa-node-id", cells(&[0])))
            .child(memory("", 1 << 20));
        let dtb = blob(&root, &[]);
        let want = Err(FdtError::Malformed {
            at: be32(&dtb, 8).unwrap() as usize,
            kind: Malformed::UnnamedNode,
        });
        assert_eq!(parse(&dtb, &mut Out::new(2, 2, 0).topo()).map(|_| ()), want);
        assert_eq!(for_each_reservation(&dtb, |_, _| {}), want);
        assert_eq!(
            string_property(&dtb, "/chosen", "bootargs").map(|_| ()),
            want
        );
    }
}
