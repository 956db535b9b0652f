//! Decoding the bytes of a tree: big-endian words, and the property values the reader uses, each
//! with bounds checks. Every error names the offset of the value in the tree (`dtb`).
#![deny(unsafe_code)]

use super::error::FdtError;
use crate::topology::NodeId;

/// The big-endian word at `at`, or `None` past the end.
pub(super) fn be32(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

/// The big-endian double word at `at`, or `None` past the end.
pub(super) fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some((u64::from(be32(b, at)?) << 32) | u64::from(be32(b, at + 4)?))
}

/// The byte offset of `part` (a slice of the tree) in `dtb`.
pub(super) fn offset_in(dtb: &[u8], part: &[u8]) -> usize {
    part.as_ptr().addr().wrapping_sub(dtb.as_ptr().addr())
}

/// The byte offset of `part` in `dtb`, or `None` if `part` is not a slice of `dtb`: for what the
/// `fdt` crate may hand out from its own storage rather than from the tree.
pub(super) fn position_in(dtb: &[u8], part: &[u8]) -> Option<usize> {
    let at = part.as_ptr().addr().checked_sub(dtb.as_ptr().addr())?;
    (at.checked_add(part.len())? <= dtb.len()).then_some(at)
}

fn bad_property(dtb: &[u8], value: &[u8]) -> FdtError {
    FdtError::BadProperty {
        at: offset_in(dtb, value),
        len: value.len(),
    }
}

/// `#address-cells` and `#size-cells` of a node: how `reg` values of its children are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cells {
    /// Cells in an address, 1 or 2.
    pub(super) address: u32,
    /// Cells in a size, 1 or 2.
    pub(super) size: u32,
}

impl Cells {
    /// The cells the two values give, or for one absent Linux's default for the root
    /// (`OF_ROOT_NODE_ADDR_CELLS_DEFAULT` and `OF_ROOT_NODE_SIZE_CELLS_DEFAULT`: 1 address cell,
    /// 1 size cell, where the devicetree specification says 2 address cells).
    pub(super) fn read(
        dtb: &[u8],
        address_cells: Option<&[u8]>,
        size_cells: Option<&[u8]>,
    ) -> Result<Cells, FdtError> {
        Ok(Cells {
            address: cell_count(dtb, address_cells, 1)?,
            size: cell_count(dtb, size_cells, 1)?,
        })
    }
}

/// A `#address-cells` or `#size-cells` value (1 or 2), or `default` without one.
fn cell_count(dtb: &[u8], value: Option<&[u8]>, default: u32) -> Result<u32, FdtError> {
    let Some(v) = value else {
        return Ok(default);
    };
    match u32_value(dtb, v)? {
        c @ (1 | 2) => Ok(c),
        cells => Err(FdtError::BadCells {
            at: offset_in(dtb, v),
            cells,
        }),
    }
}

/// A string value without its NUL.
pub(super) fn string<'d>(dtb: &[u8], value: &'d [u8]) -> Result<&'d str, FdtError> {
    let (last, text) = value.split_last().ok_or(bad_property(dtb, value))?;
    if *last != 0 {
        return Err(bad_property(dtb, value));
    }
    core::str::from_utf8(text).map_err(|_| bad_property(dtb, value))
}

/// A `bootargs` value as Linux's `early_init_dt_scan_chosen` copies it with `strscpy` of the
/// value's length: `None` if it is empty, else its bytes up to the first NUL (all but the last
/// byte without one).
///
/// # Errors
/// Bytes before that point that are not UTF-8.
pub(super) fn bootargs<'d>(dtb: &[u8], value: &'d [u8]) -> Result<Option<&'d str>, FdtError> {
    let Some((_, most)) = value.split_last() else {
        return Ok(None);
    };
    let end = value.iter().position(|&b| b == 0).unwrap_or(most.len());
    let text = value.get(..end).unwrap_or(most);
    core::str::from_utf8(text)
        .map(Some)
        .map_err(|_| bad_property(dtb, value))
}

/// A one-cell value.
pub(super) fn u32_value(dtb: &[u8], value: &[u8]) -> Result<u32, FdtError> {
    if value.len() != 4 {
        return Err(bad_property(dtb, value));
    }
    be32(value, 0).ok_or(bad_property(dtb, value))
}

/// A `numa-node-id` value.
pub(super) fn node_id(dtb: &[u8], value: &[u8]) -> Result<NodeId, FdtError> {
    let id = u32_value(dtb, value)?;
    NodeId::try_new(id as usize).ok_or(FdtError::NodeIdOutOfRange {
        at: offset_in(dtb, value),
        id,
    })
}

/// One `(address, size)` entry of a `reg` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RegEntry {
    /// Offset of the entry in the tree.
    pub(super) at: usize,
    /// The address.
    pub(super) base: u64,
    /// The size in bytes.
    pub(super) size: u64,
}

/// Calls `f` with each entry of a `reg` value laid out in `cells`.
pub(super) fn reg(
    dtb: &[u8],
    value: &[u8],
    cells: Cells,
    mut f: impl FnMut(RegEntry) -> Result<(), FdtError>,
) -> Result<(), FdtError> {
    let entry = ((cells.address + cells.size) * 4) as usize;
    if value.is_empty() || !value.len().is_multiple_of(entry) {
        return Err(bad_property(dtb, value));
    }
    let read = |b: &[u8], at: usize, cells: u32| {
        if cells == 2 {
            be64(b, at).unwrap_or(0)
        } else {
            u64::from(be32(b, at).unwrap_or(0))
        }
    };
    for e in value.chunks_exact(entry) {
        f(RegEntry {
            at: offset_in(dtb, e),
            base: read(e, 0, cells.address),
            size: read(e, (cells.address * 4) as usize, cells.size),
        })?;
    }
    Ok(())
}

/// `true` if `value` is the string `s`.
pub(super) fn is(value: Option<&[u8]>, s: &str) -> bool {
    value.is_some_and(|v| v.strip_suffix(&[0]) == Some(s.as_bytes()))
}

/// `true` if a `status` value (or its absence) says the device is there.
pub(super) fn available(status: Option<&[u8]>) -> bool {
    status.is_none() || is(status, "okay") || is(status, "ok")
}

/// `true` if a CPU's `status` says it is unusable: `"fail"` or `"fail-…"` (Linux's
/// `__of_device_is_fail`).
pub(super) fn failed(status: Option<&[u8]>) -> bool {
    status.is_some_and(|v| {
        let s = v.split(|b| *b == 0).next().unwrap_or_default();
        s == b"fail" || s.starts_with(b"fail-")
    })
}

/// `true` if a `compatible` string list names `s`, in any case (Linux's `of_compat_cmp` is
/// `strcasecmp`).
pub(super) fn compatible_with(compatible: Option<&[u8]>, s: &str) -> bool {
    compatible.is_some_and(|v| {
        v.split(|b| *b == 0)
            .any(|c| c.eq_ignore_ascii_case(s.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::super::test_tree::{Out, TestNode, blob, cells, string};
    use super::*;

    #[test]
    fn property_values_are_checked() {
        let mut o = Out::new(4, 8, 8);
        // A numa-node-id of two cells.
        let root = TestNode::new("").child(
            TestNode::new("memory@0")
                .prop("device_type", string("memory"))
                .prop("reg", cells(&[0, 1 << 30, 0, 1 << 30]))
                .prop("numa-node-id", cells(&[0, 0])),
        );
        assert!(matches!(
            parse(&blob(&root, &[]), &mut o.topo()),
            Err(FdtError::BadProperty { len: 8, .. })
        ));
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[3]))
            .child(TestNode::new("memory@0"));
        assert!(matches!(
            parse(&blob(&root, &[]), &mut o.topo()),
            Err(FdtError::BadCells { cells: 3, .. })
        ));
    }

    #[test]
    fn words_stop_at_the_end() {
        let b = [0, 0, 0, 1, 0, 0, 0, 2];
        assert_eq!(be32(&b, 4), Some(2));
        assert_eq!(be32(&b, 5), None);
        assert_eq!(be32(&b, usize::MAX - 1), None);
        assert_eq!(be64(&b, 0), Some((1 << 32) | 2));
        assert_eq!(be64(&b, 1), None);
    }
}
