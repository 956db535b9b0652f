//! [`parse`]: the parameters of a command line turned into a [`HugepageConfig`], with the value
//! of each checked as it is read.
#![deny(unsafe_code)]

use super::config::{HugepageConfig, MAX_NODE_ENTRIES, NodeCount, PerSize, PoolRequest};
use super::error::{CmdlineError, CmdlineErrorKind};
use super::number::{NumError, parse_digits, parse_size};
use super::params::{Name, Params, slice};
use crate::addr::HugeSize;
use crate::topology::NodeId;

/// Parses the huge-page parameters of a kernel command line; see the [module docs](super) for
/// the syntax and for which size each `hugepages=` applies to.
///
/// # Errors
/// The first rejected parameter in input order, as a [`CmdlineError`].
pub fn parse(cmdline: &str) -> Result<HugepageConfig, CmdlineError> {
    let input = cmdline.as_bytes();
    // Linux decides the default size in `hugetlb_init`, after the whole line. Finding it first
    // lets a `hugepages=` before `default_hugepagesz=` be checked against the right size as it
    // is read, so errors come out in input order. If the first `default_hugepagesz=` is bad, the
    // loop below fails on it; until then 2 MiB stands in, which is Linux's fallback too.
    let default_size = Params::new(input)
        .find_map(|p| match p.name() {
            Some(Name::DefaultHugepagesz) => Some(p.value),
            _ => None,
        })
        .and_then(|value| parse_size(value).ok())
        .and_then(HugeSize::from_bytes)
        .unwrap_or(HugeSize::Size2M);

    let mut config = HugepageConfig {
        default_size,
        requests: PerSize::default(),
        first_named: None,
    };
    let mut size_named = PerSize::<bool>::default();
    let mut default_named = false;
    // The size the next `hugepages=` applies to.
    let mut target = default_size;

    for param in Params::new(input) {
        let Some(name) = param.name() else { continue };
        let fail = |kind| CmdlineError {
            offset: param.offset,
            kind,
        };
        if param.value.is_empty() {
            return Err(fail(CmdlineErrorKind::MissingValue));
        }
        match name {
            Name::Hugepagesz => {
                let size = size_value(param.value).map_err(fail)?;
                if core::mem::replace(size_named.get_mut(size), true) {
                    return Err(fail(CmdlineErrorKind::DuplicateSize));
                }
                config.first_named.get_or_insert(size);
                target = size;
            }
            Name::DefaultHugepagesz => {
                let size = size_value(param.value).map_err(fail)?;
                if core::mem::replace(&mut default_named, true) {
                    return Err(fail(CmdlineErrorKind::DuplicateDefaultSize));
                }
                config.first_named.get_or_insert(size);
                // The first `default_hugepagesz=` parsed cleanly, so it is the one the
                // look-ahead above found: `size == default_size`.
                target = size;
            }
            Name::Hugepages => {
                let request = parse_request(param.value, param.value_offset, param.offset)?;
                let slot = config.requests.get_mut(target);
                if slot.is_some() {
                    return Err(fail(CmdlineErrorKind::DuplicateCount));
                }
                *slot = Some(request);
            }
        }
    }
    Ok(config)
}

/// `bytes` without its leading white space, as the kernel's `vsscanf` skips it before an
/// integer conversion.
fn skip_spaces(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|&&b| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .count();
    slice(bytes, n, bytes.len())
}

/// The value of `hugepagesz=` or `default_hugepagesz=`.
fn size_value(value: &[u8]) -> Result<HugeSize, CmdlineErrorKind> {
    match parse_size(value) {
        Ok(bytes) => HugeSize::from_bytes(bytes).ok_or(CmdlineErrorKind::UnsupportedSize),
        Err(NumError::Malformed) => Err(CmdlineErrorKind::MalformedSize),
        Err(NumError::Overflow) => Err(CmdlineErrorKind::UnsupportedSize),
    }
}

/// The value of `hugepages=`, which starts at `value_offset`; `param_offset` is where the
/// parameter starts.
fn parse_request(
    value: &[u8],
    value_offset: usize,
    param_offset: usize,
) -> Result<PoolRequest, CmdlineError> {
    if !value.contains(&b':') {
        return match parse_digits(skip_spaces(value), 10) {
            Ok(n) => Ok(PoolRequest::Balanced(n)),
            Err(e) => Err(CmdlineError {
                offset: param_offset,
                kind: match e {
                    NumError::Malformed => CmdlineErrorKind::MalformedCount,
                    NumError::Overflow => CmdlineErrorKind::CountOverflow,
                },
            }),
        };
    }

    let mut entries = heapless::Vec::<NodeCount, MAX_NODE_ENTRIES>::new();
    let mut sum = 0u64;
    let mut entry_offset = value_offset;
    let mut pieces = value.split(|&b| b == b',').peekable();
    while let Some(entry) = pieces.next() {
        let at = entry_offset;
        let fail = move |kind| Err(CmdlineError { offset: at, kind });
        if entry.is_empty() {
            // A trailing empty entry starts at the end of the value: name its comma instead,
            // so the offset stays inside the input. (There is one: the value is not empty.)
            let offset = if pieces.peek().is_some() {
                at
            } else {
                at.saturating_sub(1)
            };
            return Err(CmdlineError {
                offset,
                kind: CmdlineErrorKind::EmptyNodeEntry,
            });
        }
        let Some(colon) = entry.iter().position(|&b| b == b':') else {
            return fail(CmdlineErrorKind::MalformedNodeEntry);
        };
        // `sscanf("%lu")` skips white space before each number.
        let node = parse_digits(skip_spaces(slice(entry, 0, colon)), 10);
        let count = parse_digits(skip_spaces(slice(entry, colon + 1, entry.len())), 10);
        // Form first, then range, so `x:1` and `1:x` say what is malformed.
        let node = match node {
            Err(NumError::Malformed) => return fail(CmdlineErrorKind::MalformedNodeEntry),
            Err(NumError::Overflow) => None,
            Ok(n) => usize::try_from(n).ok().and_then(NodeId::try_new),
        };
        let count = match count {
            Err(NumError::Malformed) => return fail(CmdlineErrorKind::MalformedCount),
            Err(NumError::Overflow) => None,
            Ok(c) => Some(c),
        };
        let Some(node) = node else {
            return fail(CmdlineErrorKind::UnknownNode);
        };
        let Some(count) = count else {
            return fail(CmdlineErrorKind::CountOverflow);
        };
        if entries.iter().any(|e| e.node == node) {
            return fail(CmdlineErrorKind::DuplicateNode);
        }
        let Some(new_sum) = sum.checked_add(count) else {
            return fail(CmdlineErrorKind::CountOverflow);
        };
        sum = new_sum;
        let new_entry = NodeCount {
            node,
            count,
            offset: entry_offset,
        };
        if entries.push(new_entry).is_err() {
            return fail(CmdlineErrorKind::TooManyNodeEntries);
        }
        // Offsets stay within the input's length plus one, far from `usize::MAX`.
        entry_offset += entry.len() + 1;
    }
    Ok(PoolRequest::PerNode(entries))
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::format;
    use std::string::{String, ToString};
    use std::vec::Vec;

    use super::super::test_support::{balanced, err, ok, per_node};
    use super::*;
    use crate::topology::MAX_NODES;

    use CmdlineErrorKind as K;
    use HugeSize::{Size1G, Size2M};

    #[test]
    fn plain_counts() {
        let cfg = ok("hugepages=16");
        assert_eq!(cfg.default_size(), Size2M);
        assert_eq!(balanced(&cfg, Size2M), Some(16));
        assert_eq!(cfg.request(Size1G), None);

        let cfg = ok("console=ttyS0 hugepagesz=1G hugepages=8 quiet hugepagesz=2M hugepages=512");
        assert_eq!(balanced(&cfg, Size1G), Some(8));
        assert_eq!(balanced(&cfg, Size2M), Some(512));
        assert_eq!(cfg.total(Size1G), 8);
        assert_eq!(cfg.total(Size2M), 512);

        assert_eq!(balanced(&ok("hugepages=0"), Size2M), Some(0));
        assert_eq!(balanced(&ok("hugepages=007"), Size2M), Some(7));
        let max = ok("hugepages=18446744073709551615");
        assert_eq!(max.total(Size2M), u64::MAX);
        // A size named without a count registers nothing here.
        let named = ok("hugepagesz=1G");
        assert_eq!((named.request(Size1G), named.request(Size2M)), (None, None));
        assert_eq!(named.first_named(), Some(Size1G));
        assert_eq!(
            balanced(&ok("hugepagesz=2M hugepagesz=1G hugepages=3"), Size1G),
            Some(3)
        );
    }

    #[test]
    fn default_size_positions() {
        // hugetlbpage.rst: on x86 these all ask for 256 pages of 2 MiB.
        for s in [
            "hugepages=256",
            "default_hugepagesz=2M hugepages=256",
            "hugepages=256 default_hugepagesz=2M",
        ] {
            let cfg = ok(s);
            assert_eq!(cfg.default_size(), Size2M);
            assert_eq!(balanced(&cfg, Size2M), Some(256), "{s}");
            assert_eq!(cfg.request(Size1G), None, "{s}");
        }
        // A count before any size goes to the default size, wherever the default is named.
        for s in [
            "default_hugepagesz=1G hugepages=4",
            "hugepages=4 default_hugepagesz=1G",
            "hugepages=4 hugepagesz=2M hugepages=9 default_hugepagesz=1G",
            "default-hugepagesz=1G hugepages=4",
        ] {
            let cfg = ok(s);
            assert_eq!(cfg.default_size(), Size1G, "{s}");
            assert_eq!(balanced(&cfg, Size1G), Some(4), "{s}");
        }
        // `default_hugepagesz=` moves the parser to its size, as `hugepagesz=` does.
        let cfg = ok("hugepagesz=2M hugepages=1 default_hugepagesz=1G hugepages=4");
        assert_eq!(balanced(&cfg, Size2M), Some(1));
        assert_eq!(balanced(&cfg, Size1G), Some(4));
        // ... even for a size `hugepagesz=` named already (Linux would pick 2M here).
        let cfg = ok("hugepagesz=1G hugepagesz=2M default_hugepagesz=1G hugepages=3");
        assert_eq!(balanced(&cfg, Size1G), Some(3));
        // `hugepagesz=` may repeat the default size, as in Linux.
        let cfg = ok("default_hugepagesz=1G hugepagesz=1G hugepages=3");
        assert_eq!(balanced(&cfg, Size1G), Some(3));
        let cfg = ok("hugepagesz=1G hugepages=2 default_hugepagesz=1G");
        assert_eq!(cfg.default_size(), Size1G);
        assert_eq!(balanced(&cfg, Size1G), Some(2));
    }

    #[test]
    fn node_lists() {
        let s = "hugepagesz=2M hugepages=0:1,1:2";
        let cfg = ok(s);
        assert_eq!(per_node(&cfg, Size2M), [(0, 1, 24), (1, 2, 28)]);
        assert_eq!(cfg.total(Size2M), 3);
        assert_eq!(&s[24..27], "0:1");
        assert_eq!(&s[28..], "1:2");

        let cfg = ok("hugepages=3:0 default_hugepagesz=1G");
        assert_eq!(per_node(&cfg, Size1G), [(3, 0, 10)]);
        assert_eq!(cfg.total(Size1G), 0);

        let cfg = ok("hugepagesz=1G hugepages=1023:1,0:0");
        assert_eq!(per_node(&cfg, Size1G), [(1023, 1, 24), (0, 0, 31)]);

        let max = u64::MAX - 1;
        let cfg = ok(&format!("hugepages=0:{max},7:1"));
        assert_eq!(cfg.total(Size2M), u64::MAX);

        let list: Vec<String> = (0..MAX_NODE_ENTRIES).map(|n| format!("{n}:1")).collect();
        let cfg = ok(&format!("hugepages={}", list.join(",")));
        assert_eq!(cfg.total(Size2M), MAX_NODE_ENTRIES as u64);
    }

    #[test]
    fn duplicate_sizes() {
        err("ro hugepagesz=1G hugepagesz=1G", 17, K::DuplicateSize);
        err(
            "hugepagesz=2M hugepages=1 hugepagesz=2048K",
            26,
            K::DuplicateSize,
        );
        err(
            "default_hugepagesz=1G default_hugepagesz=1G",
            22,
            K::DuplicateDefaultSize,
        );
        err(
            "default_hugepagesz=2M x default-hugepagesz=1G",
            24,
            K::DuplicateDefaultSize,
        );
    }

    #[test]
    fn count_errors() {
        err("hugepages=", 0, K::MissingValue);
        err("quiet hugepages=\"\"", 6, K::MissingValue);
        err("hugepagesz=", 0, K::MissingValue);
        err("x default_hugepagesz=", 2, K::MissingValue);
        err("hugepages=x", 0, K::MalformedCount);
        err("hugepages=4x", 0, K::MalformedCount);
        err("hugepages=4,5", 0, K::MalformedCount);
        err("hugepages=-1", 0, K::MalformedCount);
        err("hugepages=+1", 0, K::MalformedCount);
        err("hugepages=0x10", 0, K::MalformedCount);
        err(
            "hugepagesz=1G hugepages=18446744073709551616",
            14,
            K::CountOverflow,
        );
        // A second count for one size, however it comes about: the later one is named.
        err("hugepages=1 hugepages=2", 12, K::DuplicateCount);
        err(
            "hugepagesz=2M hugepages=1 hugepages=0:1",
            26,
            K::DuplicateCount,
        );
        err(
            "hugepages=256 hugepagesz=2M hugepages=512",
            28,
            K::DuplicateCount,
        );
        err(
            "hugepages=2 default_hugepagesz=1G hugepagesz=1G hugepages=3",
            48,
            K::DuplicateCount,
        );
        err(
            "default_hugepagesz=1G hugepages=2 hugepagesz=1G hugepages=3",
            48,
            K::DuplicateCount,
        );
        err(
            "hugepages=2 default_hugepagesz=2M hugepages=3",
            34,
            K::DuplicateCount,
        );
    }

    #[test]
    fn node_list_errors() {
        // hugepages= is at 0, its value at 10.
        err("hugepages=0:4,,1:2", 14, K::EmptyNodeEntry);
        err("hugepages=,0:4", 10, K::EmptyNodeEntry);
        err("hugepages=0:4,", 13, K::EmptyNodeEntry);
        err("hugepages=\"0:4,\" quiet", 14, K::EmptyNodeEntry);
        err("hugepages=0:4,5", 14, K::MalformedNodeEntry);
        err("hugepages=x:4", 10, K::MalformedNodeEntry);
        err("hugepages=:4", 10, K::MalformedNodeEntry);
        err("hugepages=-1:4", 10, K::MalformedNodeEntry);
        err("hugepages=0:4,1:", 14, K::MalformedCount);
        err("hugepages=0:4:5", 10, K::MalformedCount);
        err("hugepages=0:x", 10, K::MalformedCount);
        err("hugepages=9999:x", 10, K::MalformedCount);
        err("hugepages=1:1,1024:1", 14, K::UnknownNode);
        err("hugepages=99999999999999999999999:1", 10, K::UnknownNode);
        err("hugepages=0:1,1:2,0:3", 18, K::DuplicateNode);
        err("hugepages=0:1,00:3", 14, K::DuplicateNode);
        err("hugepages=0:18446744073709551616", 10, K::CountOverflow);
        err("hugepages=0:18446744073709551615,1:1", 33, K::CountOverflow);

        let mut list: Vec<String> = (0..=MAX_NODE_ENTRIES).map(|n| format!("{n}:1")).collect();
        let s = format!("hugepages={}", list.join(","));
        let at = s.find(",64:1").unwrap() + 1;
        err(&s, at, K::TooManyNodeEntries);
        // Form errors in the entry that does not fit still come first.
        list[MAX_NODE_ENTRIES] = String::from("64:q");
        err(
            &format!("hugepages={}", list.join(",")),
            at,
            K::MalformedCount,
        );
    }

    #[test]
    fn errors_come_in_input_order() {
        // The duplicate at byte 26 is found before the bad size at byte 38, although which size
        // the count at byte 0 is for depends on the last parameter.
        err(
            "hugepages=2 hugepagesz=2M hugepages=3 hugepagesz=5M default_hugepagesz=2M",
            26,
            K::DuplicateCount,
        );
        err(
            "hugepages=1 default_hugepagesz=1G hugepagesz=3M",
            34,
            K::UnsupportedSize,
        );
        // A bad default size is reported where it stands.
        err("hugepages=1 default_hugepagesz=3M", 12, K::UnsupportedSize);
    }

    use numaframe_testkit_base::Rng;

    fn pick<'a>(rng: &mut Rng, from: &[&'a str]) -> &'a str {
        from[rng.index(from.len())]
    }

    const FRAGMENTS: &[&str] = &[
        "hugepages=",
        "hugepagesz=",
        "default_hugepagesz=",
        "default-hugepagesz=",
        "hugepages",
        "=",
        "2M",
        "1G",
        "2048K",
        "1048576k",
        "0x",
        "0x200000",
        "0",
        "1",
        "7",
        "9",
        "1023",
        "1024",
        "18446744073709551615",
        "18446744073709551616",
        ":",
        ",",
        " ",
        "\t",
        "\n",
        "\x0b",
        "\"",
        "--",
        "-",
        "_",
        "K",
        "M",
        "G",
        "E",
        "x",
        "é",
        "€",
        "😀",
        "\u{a0}",
        "console=ttyS0",
        "quiet",
    ];

    const SEEDS: &[&str] = &[
        "hugepagesz=1G hugepages=0:4,1:2 hugepagesz=2M hugepages=512",
        "hugepages=256 default_hugepagesz=1G",
        "default_hugepagesz=1G hugepagesz=1G hugepages=3 hugepagesz=2M hugepages=0:1,1:1,2:1",
        "ro quiet \"hugepages=4\" -- hugepages=x",
        "hugepages=\"0:18446744073709551614,7:1\" hugepagesz=0x40000000",
    ];

    /// Everything a successful parse promises, and offsets of errors in range.
    fn check(s: &str) {
        match parse(s) {
            Err(e) => {
                assert!(e.offset < s.len(), "{s:?}: {e:?}");
                assert!(s.is_char_boundary(e.offset), "{s:?}: {e:?}");
                let _ = e.to_string();
            }
            Ok(cfg) => {
                for size in HugeSize::ALL {
                    if let Some(PoolRequest::PerNode(v)) = cfg.request(size) {
                        assert!(v.len() <= MAX_NODE_ENTRIES);
                        let mut sum = 0u64;
                        for (i, e) in v.iter().enumerate() {
                            assert!(e.offset < s.len() && s.is_char_boundary(e.offset));
                            assert!(e.node.index() < MAX_NODES);
                            assert!(v[..i].iter().all(|o| o.node != e.node));
                            sum = sum.checked_add(e.count).expect("sum overflows");
                        }
                        assert_eq!(cfg.total(size), sum);
                        assert!(cfg.validate_nodes(0).is_err());
                    }
                }
                assert_eq!(cfg.validate_nodes(MAX_NODES), Ok(()));
                let _ = format!("{cfg:?}");
            }
        }
        // An unrelated parameter in front only shifts offsets.
        let prefix = "console=ttyS0 ";
        match (parse(s), parse(&format!("{prefix}{s}"))) {
            (Err(a), Err(b)) => {
                assert_eq!(a.kind, b.kind, "{s:?}");
                assert_eq!(a.offset + prefix.len(), b.offset, "{s:?}");
            }
            (Ok(a), Ok(b)) => {
                assert_eq!(a.default_size(), b.default_size(), "{s:?}");
                for size in HugeSize::ALL {
                    assert_eq!(a.total(size), b.total(size), "{s:?}");
                }
            }
            (a, b) => panic!("{s:?}: {a:?} vs {b:?}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "a safe parser over random input: the release-checked run and the cmdline fuzz target cover it"
    )]
    fn no_panic_on_random_input() {
        let rounds = 60_000;
        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut outcomes = [0usize; 2];
        for _ in 0..rounds {
            let mut s = String::new();
            if rng.index(2) == 0 {
                // Random fragments.
                for _ in 0..rng.index(14) {
                    s.push_str(pick(&mut rng, FRAGMENTS));
                }
            } else {
                // A valid line, mutated a few times.
                s.push_str(pick(&mut rng, SEEDS));
                for _ in 0..=rng.index(4) {
                    let mut at = rng.index(s.len() + 1);
                    while !s.is_char_boundary(at) {
                        at -= 1;
                    }
                    match rng.index(3) {
                        0 => s.insert_str(at, pick(&mut rng, FRAGMENTS)),
                        1 => {
                            let mut end = (at + 1 + rng.index(4)).min(s.len());
                            while !s.is_char_boundary(end) {
                                end += 1;
                            }
                            s.replace_range(at..end, "");
                        }
                        _ => {
                            let b = (rng.next_u64() % 0x80) as u8;
                            s.insert(at, char::from(b));
                        }
                    }
                }
            }
            outcomes[usize::from(parse(&s).is_ok())] += 1;
            check(&s);
        }
        // The generator reaches both outcomes often.
        assert!(
            outcomes[0] > rounds / 10 && outcomes[1] > rounds / 10,
            "{outcomes:?}"
        );
    }
}
