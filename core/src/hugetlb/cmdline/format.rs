//! Huge page sizes in Linux's words.
#![deny(unsafe_code)]

use core::fmt;

use crate::addr::HugeSize;

/// Shows a huge page size the way Linux's `string_get_size(size, 1, STRING_UNITS_2, …)` does:
/// `2.00 MiB`, `1.00 GiB`, as in `HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages`.
#[must_use]
pub fn format_size(size: HugeSize) -> FormattedSize {
    FormattedSize(size)
}

/// A huge page size shown as Linux shows it; made by [`format_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormattedSize(HugeSize);

impl fmt::Display for FormattedSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            HugeSize::Size2M => "2.00 MiB",
            HugeSize::Size1G => "1.00 GiB",
        })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::ToString;

    use super::*;
    use HugeSize::{Size1G, Size2M};

    #[test]
    fn sizes() {
        assert_eq!(format_size(Size2M).to_string(), "2.00 MiB");
        assert_eq!(format_size(Size1G).to_string(), "1.00 GiB");
        assert_eq!(
            format!(
                "HugeTLB: registered {} page size, pre-allocated {} pages",
                format_size(Size1G),
                8
            ),
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages"
        );
    }
}
