//! The tokenizer: a command line split into `name=value` parameters the way Linux's `next_arg`
//! splits it, and the names this reader handles.
#![deny(unsafe_code)]

/// The parameters this reader handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Name {
    Hugepagesz,
    Hugepages,
    DefaultHugepagesz,
}

/// One `name=value` parameter of the command line (parameters without `=` are skipped).
#[derive(Clone, Copy, Debug)]
pub(super) struct Param<'a> {
    /// First byte of the parameter, its opening quote included.
    pub(super) offset: usize,
    name: &'a [u8],
    /// The value, quotes removed.
    pub(super) value: &'a [u8],
    /// First byte of `value`.
    pub(super) value_offset: usize,
}

impl Param<'_> {
    /// Which of our parameters this is, comparing `-` and `_` alike as Linux's `parameqn` does.
    pub(super) fn name(&self) -> Option<Name> {
        const NAMES: [(&[u8], Name); 3] = [
            (b"hugepagesz", Name::Hugepagesz),
            (b"hugepages", Name::Hugepages),
            (b"default_hugepagesz", Name::DefaultHugepagesz),
        ];
        let fold = |b: u8| if b == b'-' { b'_' } else { b };
        NAMES
            .iter()
            .find(|(want, _)| {
                want.len() == self.name.len()
                    && want.iter().zip(self.name).all(|(&w, &n)| w == fold(n))
            })
            .map(|&(_, name)| name)
    }
}

/// Linux's `isspace` on ASCII. (Linux also counts the Latin-1 byte 0xA0; in UTF-8 that byte is
/// part of a longer character, so splitting there would cut the character.)
const fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `bytes[from..to]`, or nothing if out of range (never, for the ranges used here).
pub(super) fn slice(bytes: &[u8], from: usize, to: usize) -> &[u8] {
    bytes.get(from..to).unwrap_or_default()
}

/// The `name=value` parameters of a command line, split as Linux's `next_arg` splits them, up to
/// a bare `--`.
#[derive(Clone, Debug)]
pub(super) struct Params<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Params<'a> {
    pub(super) fn new(input: &'a [u8]) -> Self {
        Self { input, pos: 0 }
    }
}

impl<'a> Iterator for Params<'a> {
    type Item = Param<'a>;

    fn next(&mut self) -> Option<Param<'a>> {
        let input = self.input;
        loop {
            while input.get(self.pos).copied().is_some_and(is_space) {
                self.pos += 1;
            }
            let offset = self.pos;
            let &first = input.get(offset)?;
            let quoted = first == b'"';
            let start = if quoted { offset + 1 } else { offset };
            let mut end = start;
            let mut in_quote = quoted;
            let mut equals = None;
            while let Some(&b) = input.get(end) {
                if is_space(b) && !in_quote {
                    break;
                }
                if b == b'=' && equals.is_none() {
                    equals = Some(end);
                }
                if b == b'"' {
                    in_quote = !in_quote;
                }
                end += 1;
            }
            // `end` is at a space or the end of the input; the next call skips it.
            self.pos = end;
            // Linux drops one closing quote, the last byte, if the parameter or its value
            // opened with one.
            let unquote_end = |from: usize| {
                if end > from && input.get(end - 1) == Some(&b'"') {
                    end - 1
                } else {
                    end
                }
            };
            let Some(eq) = equals else {
                let name_end = if quoted { unquote_end(start) } else { end };
                if slice(input, start, name_end) == b"--" {
                    self.pos = input.len();
                    return None;
                }
                continue;
            };
            let mut value_offset = eq + 1;
            let value_quoted = value_offset < end && input.get(value_offset) == Some(&b'"');
            if value_quoted {
                value_offset += 1;
            }
            let value_end = if quoted || value_quoted {
                unquote_end(value_offset)
            } else {
                end
            };
            return Some(Param {
                offset,
                name: slice(input, start, eq),
                value: slice(input, value_offset, value_end),
                value_offset,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{balanced, ok, per_node};
    use super::super::{HugepageConfig, parse};
    use crate::addr::HugeSize::{Size1G, Size2M};

    #[test]
    fn empty_and_unrelated() {
        for s in [
            "",
            "   ",
            "\t\n",
            "console=ttyS0 quiet",
            "BOOT_IMAGE=/vmlinuz-6.8 root=UUID=1234 ro transparent_hugepage=never",
            "hugepages hugepagesz default_hugepagesz",
            "hugepageszz=3M xhugepages=4 hugepages_node=1 nohugepages=1 hugepagesz2=1G",
            "hugetlb_free_vmemmap=on hugetlb_cma=4G =hugepages=4",
        ] {
            assert_eq!(parse(s), Ok(HugepageConfig::default()), "{s:?}");
        }
        let cfg = HugepageConfig::default();
        assert_eq!(cfg.default_size(), Size2M);
        assert_eq!(cfg.request(Size2M), None);
        assert_eq!(cfg.total(Size1G), 0);
    }

    #[test]
    fn quotes_and_separators() {
        assert_eq!(balanced(&ok("\"hugepages=4\""), Size2M), Some(4));
        assert_eq!(balanced(&ok("hugepages=\"4\""), Size2M), Some(4));
        assert_eq!(
            per_node(&ok("hugepages=\"0:1,1:2\""), Size2M),
            [(0, 1, 11), (1, 2, 15)]
        );
        // Spaces inside quotes do not split, so this is one unrelated parameter.
        assert_eq!(
            ok("dyndbg=\"file x hugepages=q +p\""),
            HugepageConfig::default()
        );
        let cfg = ok("\thugepagesz=1G\n\nhugepages=2\x0b\x0c\rhugepagesz=2M  hugepages=1 ");
        assert_eq!(cfg.total(Size1G), 2);
        assert_eq!(cfg.total(Size2M), 1);
        // Parameters after `--` belong to init.
        assert_eq!(balanced(&ok("hugepages=4 -- hugepages=x"), Size2M), Some(4));
        assert_eq!(
            balanced(&ok("hugepages=4 \"--\" hugepages=x"), Size2M),
            Some(4)
        );
        assert_eq!(ok("-- default_hugepagesz=1G").default_size(), Size2M);
        // `--x` and `--=` are ordinary (ignored) parameters.
        assert_eq!(balanced(&ok("--x --= hugepages=5"), Size2M), Some(5));
        // Non-ASCII text around is fine.
        assert_eq!(
            balanced(&ok("café=été\u{a0} hugepages=5 ü"), Size2M),
            Some(5)
        );
    }
}
