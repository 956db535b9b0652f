//! The `numaframe` binary against the CLI contract (docs/): output of `zonelists`
//! against the reference vectors, JSON shape, and exit status 2 with exactly one `error:` line
//! for every kind of bad input, never a panic (101) or a signal.

use std::fs;
use std::path::Path;

use serde_json::Value;

use numaframe_testkit::samples::NUMACTL_TWO_NODES;
use numaframe_testkit::{Rng, TempDir};

mod support;
use support::*;

/// The `fallback` rows of case `name` in `tests/vectors/zonelists.json`.
fn vector(name: &str) -> Vec<Vec<u64>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/zonelists.json");
    let doc: Value = serde_json::from_str(&fs::read_to_string(&path).expect("read the vectors"))
        .expect("vectors are JSON");
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no vector {name}"));
    case["fallback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect()
        })
        .collect()
}

/// The boot-log lines for fallback rows.
fn boot_log(rows: &[Vec<u64>]) -> String {
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let ids: Vec<String> = row.iter().map(u64::to_string).collect();
            format!("Fallback order for Node {i}: {}\n", ids.join(" "))
        })
        .collect()
}

#[test]
fn zonelists_match_the_reference_vectors() {
    for name in ["amd-4node", "dual-socket-8node"] {
        let rows = vector(name);
        let (code, out, err) = numaframe(&["zonelists", "--preset", name]);
        assert_eq!((code, err.as_str()), (0, ""), "{name}");
        assert_eq!(out, boot_log(&rows), "{name}");
    }
    assert_eq!(
        vector("amd-4node"),
        [[0, 1, 2, 3], [1, 0, 3, 2], [2, 3, 0, 1], [3, 2, 1, 0]],
        "the seed's post-fix order"
    );
}

#[test]
fn zonelists_json_shape() {
    let rows = vector("dual-socket-8node");
    let (code, out, _) = numaframe(&["zonelists", "--preset", "dual-socket-8node", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "one JSON document");
    let doc: Value = serde_json::from_str(&out).unwrap();
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), rows.len());
    for (i, (node, row)) in nodes.iter().zip(&rows).enumerate() {
        assert_eq!(
            node.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["fallback", "node"]
        );
        assert_eq!(node["node"], i);
        assert_eq!(
            node["fallback"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect::<Vec<_>>(),
            *row
        );
    }
    let (_, global, _) = numaframe(&["--json", "zonelists", "--preset", "dual-socket-8node"]);
    assert_eq!(global, out, "--json before the command");
    assert!(
        out.starts_with(r#"{"nodes":[{"node":0,"fallback":[0,1,2,3,4,5,6,7]}"#),
        "{out}"
    );
}

#[test]
fn linux_boot_order() {
    // cxl-tie: CPU-less nodes 2,3 win a tie only while the CPU penalty applies.
    let dir = TempDir::new("boot");
    let toml = dir.put(
        "tie.toml",
        "distances = [[10, 20, 21, 21], [20, 10, 21, 21], [21, 21, 10, 20], [21, 21, 20, 10]]\n\
         [[node]]\nid = 0\ncpus = \"0\"\nmemory = \"1G\"\n[[node]]\nid = 1\ncpus = \"1\"\nmemory = \"1G\"\n\
         [[node]]\nid = 2\nmemory = \"1G\"\n[[node]]\nid = 3\nmemory = \"1G\"\n",
    );
    let toml = toml.display().to_string();
    let (code, out, err) = numaframe(&["zonelists", "--topology", &toml]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, boot_log(&vector("cxl-tie")));
    let (code, boot, _) = numaframe(&["zonelists", "--topology", &toml, "--linux-boot-order"]);
    assert_eq!(code, 0);
    assert_eq!(
        boot.lines().nth(1),
        Some("Fallback order for Node 1: 1 0 3 2")
    );
}

#[test]
fn every_source_gives_the_same_answer() {
    let dir = TempDir::new("sources");
    let toml = dir.put(
        "amd.toml",
        "distances = [[10,12,32,32],[12,10,32,32],[32,32,10,12],[32,32,12,10]]\n\
         [[node]]\nid = 3\ncpus = \"24-31\"\nmemory = \"16G\"\n[[node]]\nid = 2\ncpus = \"16-23\"\nmemory = \"16G\"\n\
         [[node]]\nid = 1\ncpus = \"8-15\"\nmemory = \"16G\"\n[[node]]\nid = 0\ncpus = \"0-7\"\nmemory = \"16G\"\n",
    );
    let toml = toml.display().to_string();
    let numactl = dir.put(
        "amd.txt",
        "available: 4 nodes (0-3)\n\
         node 0 cpus: 0 1 2 3 4 5 6 7\nnode 0 size: 16384 MB\nnode 0 free: 16000 MB\n\
         node 1 cpus: 8 9 10 11 12 13 14 15\nnode 1 size: 16384 MB\nnode 1 free: 16000 MB\n\
         node 2 cpus: 16 17 18 19 20 21 22 23\nnode 2 size: 16384 MB\nnode 2 free: 16000 MB\n\
         node 3 cpus: 24 25 26 27 28 29 30 31\nnode 3 size: 16384 MB\nnode 3 free: 16000 MB\n\
         node distances:\nnode   0   1   2   3\n  0:  10  12  32  32\n  1:  12  10  32  32\n  2:  32  32  10  12\n  3:  32  32  12  10\n",
    );
    let numactl = numactl.display().to_string();
    let want = boot_log(&vector("amd-4node"));
    for args in [
        ["zonelists", "--topology", &toml],
        ["zonelists", "--numactl", &numactl],
        ["zonelists", "--preset", "amd-4node"],
    ] {
        let (code, out, err) = numaframe(&args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        assert_eq!(out, want, "{args:?}");
    }
    let (code, out, _) = numaframe(&["zonelists", &format!("--topology={toml}")]);
    assert_eq!((code, out), (0, want));
}

#[test]
fn sysfs_of_this_machine() {
    let dir = Path::new("/sys/devices/system/node");
    if !dir.is_dir() {
        eprintln!("no {}; skipped", dir.display());
        return;
    }
    for args in [
        &["zonelists", "--sysfs"][..],
        &["zonelists", "--sysfs", "/sys/devices/system/node"],
        &["zonelists", "--sysfs", "--json"],
    ] {
        let (code, out, err) = numaframe(args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        assert!(!out.is_empty());
    }
    let (_, out, _) = numaframe(&["zonelists", "--sysfs"]);
    assert!(
        out.lines()
            .all(|l| l.starts_with("Fallback order for Node ")),
        "{out}"
    );
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    bad_input(&[], "no command given");
    bad_input(&["frobnicate"], "unknown command `frobnicate`");
    bad_input(&["zonelists"], "no topology given");
    bad_input(&["zonelists", "--preset", "nope"], "unknown preset `nope`");
    bad_input(
        &["zonelists", "--preset", "amd-4node", "--frob"],
        "unknown option `--frob`",
    );
    bad_input(&["zonelists", "--preset"], "`--preset` needs a value");
    bad_input(
        &["zonelists", "--preset", "amd-4node", "--numactl", "x"],
        "give one topology source",
    );
    bad_input(
        &["zonelists", "--topology", "/nonexistent/machine.toml"],
        "/nonexistent/machine.toml",
    );
    bad_input(
        &["zonelists", "--numactl", "/nonexistent/numactl.txt"],
        "/nonexistent/numactl.txt",
    );
    bad_input(
        &["zonelists", "--sysfs", "/nonexistent/node"],
        "/nonexistent/node",
    );
    bad_input(&["zonelists", "--topology", "/"], "/");
    bad_input(&["zonelists", "--topology", "/dev/zero"], "larger than");
    bad_input(&["demo", "--preset", "nope"], "unknown preset `nope`");
    bad_input(&["demo", "--frob"], "unknown option `--frob`");
    bad_input(&["demo", "extra"], "unexpected argument `extra`");
    bad_input(&["help", "frobnicate"], "unknown command `frobnicate`");
    bad_input(
        &["zonelists", "--preset", "two\nlines"],
        "unknown preset `two lines`",
    );
    // Empty values, and a lone `-` (which clap would take as a value: a separate value may
    // not start with `-`).
    bad_input(
        &["hugepages", "--preset", "amd-4node", "--cmdline", ""],
        "`--cmdline` needs a value",
    );
    bad_input(
        &["hugepages", "--preset", "amd-4node", "--cmdline", "-"],
        "`--cmdline` needs a value (TEXT)",
    );
    bad_input(
        &["frag", "--preset", "fake-64", "--svg", "-"],
        "`--svg` needs a value (FILE)",
    );
    bad_input(
        &["zonelists", "--preset", "amd-4node", "-"],
        "unexpected argument `-`",
    );
}

#[test]
fn help_exits_0() {
    for args in [
        &["help"][..],
        &["--help"],
        &["-h"],
        &["zonelists", "--help"],
        &["help", "demo"],
    ] {
        let (code, out, err) = numaframe(args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        assert!(out.contains("Usage: numaframe"), "{args:?}: {out}");
    }
    let (_, out, _) = numaframe(&["help"]);
    for word in [
        "zonelists",
        "demo",
        "--topology",
        "--numactl",
        "--sysfs",
        "--preset",
        "cxl-2socket",
        "12tb-2node",
    ] {
        assert!(out.contains(word), "help lacks {word}: {out}");
    }
}

const GOOD_TOML: &str = r#"distances = [[10, 21, 14, 24], [21, 10, 24, 14], [14, 24, 10, 34], [24, 14, 34, 10]]
socket_link_gbps = 150
[[node]]
id = 0
cpus = "0-15"
memory = "64G"
socket = 0
bandwidth_gbps = 300
[[node]]
id = 1
cpus = "16-31"
memory = "64G"
socket = 1
bandwidth_gbps = 300
[[node]]
id = 2
memory = "32G"
socket = 0
initiator = 0
bandwidth_gbps = 100
[[node]]
id = 3
cpus = ""
memory = "32G"
socket = 1
initiator = 1
bandwidth_gbps = 100
"#;

#[test]
fn malformed_files_exit_2() {
    let dir = TempDir::new("malformed");
    let cases: &[(&str, &str, &str)] = &[
        (
            "--topology",
            "bad-key.toml",
            "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncolour = 3\n",
        ),
        (
            "--topology",
            "bad-cpus.toml",
            "distances = [[10]]\n[[node]]\nid = 0\nmemory = \"1G\"\ncpus = \"0-\"\n",
        ),
        ("--topology", "bad-syntax.toml", "distances = [[10]\n"),
        (
            "--topology",
            "bad-ids.toml",
            "distances = [[10,20],[20,10]]\n[[node]]\nid = 0\nmemory = \"1G\"\n[[node]]\nid = 2\nmemory = \"1G\"\n",
        ),
        ("--topology", "empty.toml", ""),
        ("--numactl", "sparse.txt", "available: 2 nodes (0,2)\n"),
        (
            "--numactl",
            "bad-line.txt",
            "available: 1 nodes (0)\nnode 0 cpus: 0\nhello\n",
        ),
        ("--numactl", "empty.txt", ""),
    ];
    for (flag, name, text) in cases {
        let path = dir.put(name, text).display().to_string();
        let (code, out, err) = numaframe(&["zonelists", flag, &path]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(out.is_empty(), "{name}");
        assert_eq!(err.lines().count(), 1, "{name}: {err:?}");
        assert!(
            err.starts_with(&format!("error: {path}")),
            "{name}: {err:?}"
        );
    }
}

/// Truncated, shortened and byte-mutated versions of a valid file.
fn garbage(text: &str, rng: &mut Rng) -> Vec<u8> {
    const BYTES: &[u8] = b"0123456789-,:=[]\"#\n .xGMK\xff\x00";
    let mut b = text.as_bytes().to_vec();
    match rng.index(3) {
        0 => b.truncate(rng.index(b.len())),
        1 => {
            let at = rng.index(b.len());
            let end = (at + 1 + rng.index(20)).min(b.len());
            b.drain(at..end);
        }
        _ => {
            for _ in 0..=rng.index(4) {
                let at = rng.index(b.len());
                b[at] = BYTES[rng.index(BYTES.len())];
            }
        }
    }
    b
}

#[test]
fn garbage_never_panics() {
    let dir = TempDir::new("garbage");
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut codes = [0usize; 3];
    for i in 0..120 {
        let (flag, text) = if i % 2 == 0 {
            ("--topology", GOOD_TOML)
        } else {
            ("--numactl", NUMACTL_TWO_NODES)
        };
        let path = dir.path().join(format!("g{i}"));
        let bytes = garbage(text, &mut rng);
        fs::write(&path, &bytes).unwrap();
        let path = path.display().to_string();
        let json = if i % 3 == 0 {
            "--json"
        } else {
            "--linux-boot-order"
        };
        let (code, out, err) = numaframe(&["zonelists", flag, &path, json]);
        assert!(
            code == 0 || code == 2,
            "{flag} {:?}: exit {code}, stderr {err:?}",
            String::from_utf8_lossy(&bytes)
        );
        codes[code as usize] += 1;
        if code == 2 {
            assert_eq!(err.lines().count(), 1, "{err:?}");
            assert!(err.starts_with("error: ") && out.is_empty(), "{err:?}");
        } else {
            assert!(err.is_empty() && !out.is_empty(), "{err:?}");
        }
    }
    assert!(codes[2] > 0, "most garbage is rejected");
}

#[test]
fn garbage_arguments_never_panic() {
    // `demo` is left out: a valid demo line runs the whole demo, which has its own tests.
    let words = [
        "zonelists",
        "help",
        "--preset",
        "amd-4node",
        "--sysfs",
        "--topology",
        "--numactl",
        "--json",
        "-",
        "--",
        "=",
        "--preset=",
        "x",
        "",
    ];
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    for _ in 0..60 {
        let args: Vec<&str> = (0..1 + rng.index(4))
            .map(|_| words[rng.index(words.len())])
            .collect();
        let (code, _, err) = numaframe(&args);
        assert!(
            code == 0 || code == 2,
            "{args:?}: exit {code}, stderr {err:?}"
        );
        assert!(err.lines().count() <= 1, "{args:?}: {err:?}");
    }
}

/// docs/cli.md, "Arguments": "`--json` may also come before the command" and "an option given
/// twice ... [is] bad input", also when one `--json` comes before the command and one after it
/// (clap's global flag took both, exit 0, until this was checked).
#[test]
fn json_given_before_and_after_the_command_is_given_twice() {
    bad_input(
        &["--json", "zonelists", "--preset", "amd-4node", "--json"],
        "`--json` given twice",
    );
    bad_input(
        &["--json", "frag", "--json", "--preset", "fake-64"],
        "`--json` given twice",
    );
}
