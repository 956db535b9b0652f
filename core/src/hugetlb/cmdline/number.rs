//! Numbers as Linux reads them on the command line: decimal counts and node ids, and sizes as
//! `memparse` reads them, except that the whole value must be used.
#![deny(unsafe_code)]

/// Why a number was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NumError {
    /// Not of the expected form.
    Malformed,
    /// Of the expected form but beyond `u64`.
    Overflow,
}

/// Digits in `radix` (8, 10 or 16), at least one.
pub(super) fn parse_digits(digits: &[u8], radix: u32) -> Result<u64, NumError> {
    if digits.is_empty() || !digits.iter().all(|&d| char::from(d).is_digit(radix)) {
        return Err(NumError::Malformed);
    }
    digits
        .iter()
        .try_fold(0u64, |acc, &d| {
            acc.checked_mul(u64::from(radix))?
                .checked_add(u64::from(char::from(d).to_digit(radix)?))
        })
        .ok_or(NumError::Overflow)
}

/// A size as Linux's `memparse` reads it, but requiring the whole value to be used.
pub(super) fn parse_size(value: &[u8]) -> Result<u64, NumError> {
    // `simple_strtoull(…, 0)`: `0x` followed by a hex digit is hex, a leading 0 is octal.
    let (radix, body) = match value {
        [b'0', b'x' | b'X', h, ..] if h.is_ascii_hexdigit() => {
            (16, value.get(2..).unwrap_or_default())
        }
        [b'0', ..] => (8, value),
        _ => (10, value),
    };
    let digit_count = body
        .iter()
        .take_while(|&&b| char::from(b).is_digit(radix))
        .count();
    let (digits, suffix) = body.split_at_checked(digit_count).unwrap_or((body, &[]));
    let shift = match suffix {
        [] => 0,
        [b'k' | b'K'] => 10,
        [b'm' | b'M'] => 20,
        [b'g' | b'G'] => 30,
        [b't' | b'T'] => 40,
        [b'p' | b'P'] => 50,
        [b'e' | b'E'] => 60,
        _ => return Err(NumError::Malformed),
    };
    parse_digits(digits, radix)?
        .checked_mul(1u64 << shift)
        .ok_or(NumError::Overflow)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::ToString;

    use super::super::CmdlineErrorKind as K;
    use super::super::parse;
    use super::super::test_support::{balanced, err, ok};
    use crate::addr::HugeSize::{Size1G, Size2M};

    #[test]
    fn size_spellings() {
        let two_m = [
            "2M",
            "2m",
            "2048K",
            "2048k",
            "2097152",
            "0x200000",
            "0X200000",
            "010000000",
            "0x800K",
        ];
        let one_g = [
            "1G",
            "1g",
            "1024M",
            "1024m",
            "1048576K",
            "1048576k",
            "1073741824",
            "0x40000000",
            "0x1G",
            "01G",
        ];
        for (spellings, size) in [(&two_m[..], Size2M), (&one_g[..], Size1G)] {
            for s in spellings {
                let cfg = ok(&format!("hugepagesz={s} hugepages=3"));
                assert_eq!(balanced(&cfg, size), Some(3), "{s}");
                assert_eq!(ok(&format!("default_hugepagesz={s}")).default_size(), size);
            }
        }
    }

    #[test]
    fn size_errors() {
        err("console=ttyS0 hugepagesz=3M", 14, K::UnsupportedSize);
        let e = parse("console=ttyS0 hugepagesz=3M").unwrap_err();
        assert_eq!(e.to_string(), "byte 14: unsupported huge page size");
        err("hugepagesz=4K", 0, K::UnsupportedSize);
        err("hugepagesz=0", 0, K::UnsupportedSize);
        err("hugepagesz=1T", 0, K::UnsupportedSize);
        err("hugepagesz=16E", 0, K::UnsupportedSize);
        err("hugepagesz=18446744073709551616", 0, K::UnsupportedSize);
        err("hugepagesz=0x1ffffffffffffffffG", 0, K::UnsupportedSize);
        err(" default_hugepagesz=4M", 1, K::UnsupportedSize);
        err("hugepagesz=2MB", 0, K::MalformedSize);
        err("hugepagesz=M", 0, K::MalformedSize);
        err("hugepagesz=2 M", 0, K::UnsupportedSize);
        err("hugepagesz=0x", 0, K::MalformedSize);
        err("hugepagesz=09M", 0, K::MalformedSize);
        err("hugepagesz=-2M", 0, K::MalformedSize);
        err("hugepagesz=+2M", 0, K::MalformedSize);
        err("hugepagesz=2.0M", 0, K::MalformedSize);
        err("a hugepagesz=\"2Mx\"", 2, K::MalformedSize);
        err("ro default_hugepagesz=big", 3, K::MalformedSize);
    }
}
