//! One string property by path (`/psci`'s `method`, `/chosen`'s `bootargs`), for what a platform
//! reads besides the topology.
#![deny(unsafe_code)]

use super::error::FdtError;
use super::tree::Tree;
use super::value;

/// The string property `name` of the node at `path` (`/psci`, `/chosen`; a component without a
/// unit address matches the first child of that name with any), or `None` if either is absent.
///
/// # Errors
/// An [`FdtError`] for a malformed tree or a value that is not a NUL-terminated UTF-8 string.
pub fn string_property<'d>(
    dtb: &'d [u8],
    path: &str,
    name: &str,
) -> Result<Option<&'d str>, FdtError> {
    let tree = Tree::open(dtb)?;
    let mut at = tree.root();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        match tree.child(&at, part)? {
            Some(v) => at = v,
            None => return Ok(None),
        }
    }
    match tree.property(&at, name)? {
        Some(v) => value::string(dtb, v).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_tree::{amd, machine};
    use super::*;

    #[test]
    fn properties_by_path() {
        let dtb = amd();
        assert_eq!(string_property(&dtb, "/psci", "method"), Ok(Some("hvc")));
        assert_eq!(string_property(&dtb, "/nothing", "method"), Ok(None));
        assert_eq!(string_property(&dtb, "/psci", "nothing"), Ok(None));
        assert_eq!(
            string_property(&dtb, "/chosen", "bootargs"),
            Ok(Some("hugepagesz=2M hugepages=4 numaframe.linux_boot_order"))
        );
        assert_eq!(
            string_property(&dtb, "/memory@0", "device_type"),
            Ok(Some("memory"))
        );
        assert_eq!(string_property(&dtb, "/memory@1", "device_type"), Ok(None));
        let flat = machine(&[(None, 1 << 30, 1 << 30)], &[], None, None);
        assert_eq!(string_property(&flat, "/chosen", "bootargs"), Ok(None));
    }
}
