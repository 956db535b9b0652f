//! `numaframe frag` through the binary, on a small preset and on a TOML machine whose zones
//! end and begin inside pageblocks: the Linux-format lines parse, the unusable index is the
//! rule Linux prints applied to the JSON's page counts, the pageblock counts add up to the
//! pageblocks a zone's memory covers, the workloads leave what their recipes say, and the SVG
//! holds one square per pageblock in the palette of docs/cli.md.

use std::collections::BTreeMap;

use numaframe_testkit::TempDir;
use serde_json::Value;

mod support;
use support::*;

/// Node 0 crosses 4 GiB by 5 MiB (a `DMA32` and a `Normal` zone); node 1, CPU-less, starts
/// 1 MiB into a pageblock, so node 0's last pageblock and node 1's first one are the same
/// aligned 2 MiB.
const TWO_NODES: &str = r#"
distances = [[10, 20], [20, 10]]
[[node]]
id = 0
cpus = "0-1"
memory = "4101M"
[[node]]
id = 1
memory = "1027M"
"#;

const MIB_FRAMES: u64 = 256;
const PB: u64 = 512;
const ORDERS: usize = 19;

/// Where each node's memory starts, in frames: nodes back to back from 0 (docs/cli.md).
fn node_starts(sizes_mib: &[u64]) -> Vec<u64> {
    let mut at = 0;
    sizes_mib
        .iter()
        .map(|s| {
            let start = at;
            at += s * MIB_FRAMES;
            start
        })
        .collect()
}

/// The first frame of a zone of a node starting at `node_start`: `DMA32` is the part below
/// 4 GiB, `Normal` the rest.
fn zone_start(node_start: u64, zone: &str) -> u64 {
    match zone {
        "DMA32" => node_start,
        "Normal" => node_start.max(1 << 20),
        other => panic!("zone {other}"),
    }
}

/// Aligned 2 MiB ranges that `managed` frames from `start` touch: a zone's managed frames are
/// one run from its start, its metadata carved from its end.
fn pageblocks_covering(start: u64, managed: u64) -> u64 {
    if managed == 0 {
        return 0;
    }
    (start + managed - 1) / PB - start / PB + 1
}

fn run_ok(args: &[&str]) -> String {
    let (code, out, err) = numaframe(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    assert!(err.is_empty(), "{args:?}: stderr {err:?}");
    out
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = run_ok(&a);
    assert_eq!(out.lines().count(), 1, "one JSON document: {out}");
    serde_json::from_str(&out).expect("valid JSON")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A text line `Node N, zone NAME rest…` as (node, zone, the rest's tokens).
fn zone_line(line: &str) -> Option<(u64, String, Vec<String>)> {
    let rest = line.strip_prefix("Node ")?;
    let (node, rest) = rest.split_once(", zone ")?;
    let mut tokens = rest.split_whitespace().map(str::to_string);
    let zone = tokens.next()?;
    Some((node.parse().ok()?, zone, tokens.collect()))
}

/// The text's unusable-index rows (19 values of the form `d.ddd` each) and pageblock rows
/// (5 counts each), by (node, zone), after checking each row's format.
type Rows = BTreeMap<(u64, String), Vec<String>>;
fn text_rows(text: &str) -> (Rows, Rows) {
    let (mut index, mut blocks) = (Rows::new(), Rows::new());
    let mut section = 0;
    for line in text.lines() {
        if line.starts_with("Unusable free space index") {
            section = 1;
        } else if let Some(columns) = line.strip_prefix("Number of blocks type ") {
            let header: Vec<&str> = columns.split_whitespace().collect();
            assert_eq!(
                header,
                ["Free", "Whole", "Long-lived", "Short-lived", "Cached"]
            );
            section = 2;
        } else if let Some((node, zone, values)) = zone_line(line) {
            // Linux's `Node %d, zone %8s`.
            assert!(
                line.starts_with(&format!("Node {node}, zone {zone:>8} ")),
                "{line:?}"
            );
            assert_eq!(line, line.trim_end(), "no trailing space: {line:?}");
            match section {
                1 => {
                    assert_eq!(values.len(), ORDERS, "{line}");
                    for v in &values {
                        let (int, frac) = v.split_once('.').expect("x.xxx");
                        assert!(int.len() == 1 && frac.len() == 3, "{v} in {line}");
                        assert!(
                            int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()),
                            "{v}"
                        );
                    }
                    index.insert((node, zone), values);
                }
                2 => {
                    assert_eq!(values.len(), 5, "{line}");
                    assert!(values.iter().all(|v| v.parse::<u64>().is_ok()), "{line}");
                    blocks.insert((node, zone), values);
                }
                _ => panic!("zone line outside a table: {line}"),
            }
        }
    }
    (index, blocks)
}

/// Checks one run's text and JSON (same arguments, so the same state) against each other and
/// against the rules; `starts` gives each node's first frame.
fn check_report(args: &[&str], starts: &[u64]) -> Value {
    let text = run_ok(args);
    let doc = json(args);
    let (index_rows, block_rows) = text_rows(&text);
    let zones = doc["zones"].as_array().expect("zones");
    assert!(!zones.is_empty());
    assert_eq!(index_rows.len(), zones.len(), "{text}");
    assert_eq!(block_rows.len(), zones.len(), "{text}");
    for z in zones {
        let node = u(&z["node"]);
        let name = z["zone"].as_str().expect("zone name").to_string();
        let key = (node, name.clone());
        let managed = u(&z["managed_pages"]);
        let free = u(&z["free_pages"]);
        assert!(managed > 0 && free <= managed, "{z}");

        // The unusable index: Linux's (free - free in blocks >= order) * 1000 / free, in
        // thousandths, 1000 for a zone without free memory (as Linux).
        let values: Vec<f64> = z["unusable_index"]
            .as_array()
            .expect("index")
            .iter()
            .map(|v| v.as_f64().expect("number"))
            .collect();
        let unusable: Vec<u64> = z["unusable_pages"]
            .as_array()
            .expect("pages")
            .iter()
            .map(u)
            .collect();
        assert_eq!((values.len(), unusable.len()), (ORDERS, ORDERS));
        assert_eq!(
            unusable[0], 0,
            "every free frame is a free block of order 0"
        );
        for order in 0..ORDERS {
            assert!(unusable[order] <= free);
            let thousandths = (unusable[order] * 1000).checked_div(free).unwrap_or(1000);
            assert_eq!(
                values[order],
                thousandths as f64 / 1000.0,
                "{key:?} order {order}"
            );
            assert!((0.0..=1.0).contains(&values[order]));
            if order > 0 {
                assert!(
                    unusable[order] >= unusable[order - 1],
                    "{key:?} {unusable:?}"
                );
                assert!(values[order] >= values[order - 1], "{key:?} {values:?}");
            }
            assert_eq!(
                index_rows[&key][order],
                format!("{}.{:03}", thousandths / 1000, thousandths % 1000),
                "{key:?} order {order}: text and JSON"
            );
        }

        // The pageblocks: every aligned 2 MiB range the zone's frames touch, in exactly one of
        // free, whole, long-lived and short-lived.
        let b = &z["pageblocks"];
        let counts = [
            u(&b["free"]),
            u(&b["whole"]),
            u(&b["long_lived"]),
            u(&b["short_lived"]),
            u(&b["cached"]),
        ];
        let start = zone_start(starts[node as usize], &name);
        assert_eq!(
            counts[..4].iter().sum::<u64>(),
            pageblocks_covering(start, managed),
            "{key:?}: {b}"
        );
        assert!(counts[4] <= counts[2] + counts[3], "{key:?}: {b}");
        let text_counts: Vec<u64> = block_rows[&key]
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(text_counts, counts, "{key:?}: text and JSON");
        // Free pageblocks hold free frames only, but for each class's spare (a split pageblock
        // kept for the class, counted free): at most the zone's free frames.
        assert!(
            counts[0].saturating_sub(2) * PB <= free,
            "{key:?}: {b}, {free} free"
        );
    }
    let m = &doc["metadata"];
    let managed: u64 = zones.iter().map(|z| u(&z["managed_pages"])).sum();
    assert_eq!(u(&m["managed_bytes"]), managed * 4096);
    assert!(u(&m["bytes"]) > 0);
    let per_gib = m["bytes_per_gib"].as_f64().unwrap();
    let want = u(&m["bytes"]) as f64 / (managed as f64 * 4096.0 / (1u64 << 30) as f64);
    assert!((per_gib - want).abs() <= want * 1e-9, "{per_gib} vs {want}");
    assert!(
        text.contains(&format!("Metadata: {} bytes (", u(&m["bytes"]))),
        "{text}"
    );
    doc
}

/// Frames the zones of `node` have handed out.
fn used(doc: &Value, node: u64) -> u64 {
    doc["zones"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|z| u(&z["node"]) == node)
        .map(|z| u(&z["managed_pages"]) - u(&z["free_pages"]))
        .sum()
}

fn check_workloads(topology: &[&str], starts: &[u64], nodes: u64) {
    let mut base = vec!["frag"];
    base.extend_from_slice(topology);

    // As booted: no workload, nothing handed out whole, nothing short-lived.
    let doc = check_report(&base, starts);
    assert_eq!(doc["workload"], "none");
    assert!(doc["summary"].as_array().unwrap().is_empty());
    for z in doc["zones"].as_array().unwrap() {
        assert_eq!(u(&z["pageblocks"]["whole"]), 0, "{z}");
        assert_eq!(u(&z["pageblocks"]["short_lived"]), 0, "{z}");
    }

    // LLFree's recipe: after the fill and the 50% free, each round frees a tenth and
    // allocates as many again, so the held frames stay at the fill minus half of it.
    let mut churn = base.clone();
    churn.extend([
        "--workload",
        "churn",
        "--rounds",
        "5",
        "--seed",
        "7",
        "--max-gib",
        "1",
    ]);
    let doc = check_report(&churn, starts);
    assert_eq!(
        (&doc["workload"], &doc["rounds"], &doc["seed"]),
        (&Value::from("churn"), &Value::from(5), &Value::from(7))
    );
    let summary = doc["summary"].as_array().unwrap();
    assert_eq!(summary.len() as u64, nodes);
    for s in summary {
        let (filled, held) = (u(&s["filled_pages"]), u(&s["held_pages"]));
        assert!(filled <= u(&s["budget_pages"]) && filled > 0, "{s}");
        assert!(u(&s["budget_pages"]) <= 1 << 18, "at most 1 GiB: {s}");
        assert_eq!(u(&s["failed_allocations"]), 0, "{s}");
        assert_eq!(held, filled - filled / 2, "{s}");
        // The zones account for the frames the workload holds (and their own pool's).
        assert!(used(&doc, u(&s["node"])) >= held, "{s}");
    }
    // Random frees leave split pageblocks behind.
    let split: u64 = doc["zones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| u(&z["pageblocks"]["long_lived"]))
        .sum();
    assert!(split > nodes, "{split}");

    // Host and guests: guests' memory comes in whole blocks, their I/O buffers are
    // short-lived.
    let mut guests = base.clone();
    guests.extend(["--workload", "guests", "--rounds", "6", "--max-gib", "1"]);
    let doc = check_report(&guests, starts);
    let mut short = 0;
    for z in doc["zones"].as_array().unwrap() {
        short += u(&z["pageblocks"]["short_lived"]);
    }
    let mut io = 0;
    for s in doc["summary"].as_array().unwrap() {
        assert_eq!(u(&s["guest_pages_1g"]) % (1 << 18), 0, "{s}");
        assert_eq!(u(&s["guest_pages_2m"]) % 512, 0, "{s}");
        let held: u64 = [
            "guest_pages_1g",
            "guest_pages_2m",
            "guest_pages_4k",
            "host_pages",
            "io_pages",
        ]
        .iter()
        .map(|k| u(&s[*k]))
        .sum();
        assert_eq!(u(&s["held_pages"]), held, "{s}");
        assert!(u(&s["guests_created"]) >= u(&s["guests_torn_down"]));
        assert_eq!(
            u(&s["guests_alive"]),
            u(&s["guests_created"]) - u(&s["guests_torn_down"])
        );
        assert!(u(&s["host_pages"]) > 0, "{s}");
        io += u(&s["io_pages"]);
        assert!(used(&doc, u(&s["node"])) >= held, "{s}");
    }
    assert!(io > 0);
    assert!(short > 0, "I/O buffers live in short-lived pageblocks");
    // Another seed, other choices.
    guests.extend(["--seed", "99"]);
    assert_ne!(json(&guests)["summary"], doc["summary"]);
}

#[test]
fn every_workload_on_a_small_preset() {
    check_workloads(&["--preset", "fake-64"], &node_starts(&[48; 64]), 64);
}

#[test]
fn every_workload_on_zones_that_share_a_pageblock() {
    let dir = TempDir::new("frag");
    let toml = dir.put("two.toml", TWO_NODES);
    let toml = toml.to_str().unwrap();
    check_workloads(&["--topology", toml], &node_starts(&[4101, 1027]), 2);
}

/// The palette of docs/cli.md (`frag --svg`).
const FREE: &str = "#EEEEEE";
const WHOLE: &str = "#4D4D4D";
const POOL: &str = "#7B3294";
const CACHED: &str = "#1A9641";
const LONG: [&str; 4] = ["#C7D7EF", "#8FAFDF", "#5787CF", "#1F5FBF"];
const SHORT: [&str; 4] = ["#F9D8C0", "#F2B080", "#EC8840", "#E66101"];

/// Filled rectangles per fill colour.
fn rects_by_fill(svg: &str) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for line in svg.lines().filter(|l| l.trim_start().starts_with("<rect")) {
        let fill = line
            .split("fill=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("a fill");
        *by.entry(fill.to_string()).or_default() += 1;
    }
    by
}

fn check_svg(args: &[&str], per_square_one: bool) {
    let dir = TempDir::new("frag-svg");
    let path = dir.path().join("blocks.svg");
    let path = path.to_str().unwrap();
    let mut a = args.to_vec();
    a.extend(["--svg", path]);
    let doc = json(&a);
    let svg = std::fs::read_to_string(path).expect("the SVG was written");
    assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert!(svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));

    let zones = doc["zones"].as_array().unwrap();
    let total = |k: &str| -> u64 { zones.iter().map(|z| u(&z["pageblocks"][k])).sum() };
    let nodes = doc["svg"]["nodes"].as_array().expect("svg nodes");
    let mut squares = 0;
    for n in nodes {
        let node = u(&n["node"]);
        let pbs: u64 = zones
            .iter()
            .filter(|z| u(&z["node"]) == node)
            .map(|z| {
                let b = &z["pageblocks"];
                u(&b["free"]) + u(&b["whole"]) + u(&b["long_lived"]) + u(&b["short_lived"])
            })
            .sum();
        assert_eq!(u(&n["pageblocks"]), pbs, "{n}");
        let per = pbs.div_ceil(4096).max(1);
        assert_eq!(u(&n["pageblocks_per_square"]), per, "{n}");
        assert_eq!(u(&n["squares"]), pbs.div_ceil(per), "{n}");
        squares += u(&n["squares"]);
    }
    let by = rects_by_fill(&svg);
    let of = |c: &str| by.get(c).copied().unwrap_or(0);
    // The legend has one swatch per whole state and four per class; the white background is
    // one more rectangle.
    assert_eq!(of("#FFFFFF"), 1, "{by:?}");
    let long: u64 = LONG.iter().map(|c| of(c)).sum();
    let short: u64 = SHORT.iter().map(|c| of(c)).sum();
    let drawn = of(FREE) + of(WHOLE) + of(POOL) + of(CACHED) + long + short;
    assert_eq!(drawn, squares + 4 + 8, "{by:?}");
    let palette: Vec<&str> = ["#FFFFFF", FREE, WHOLE, POOL, CACHED]
        .into_iter()
        .chain(LONG)
        .chain(SHORT)
        .collect();
    assert!(
        by.keys().all(|c| palette.contains(&c.as_str())),
        "only the palette: {by:?}"
    );
    if per_square_one {
        assert_eq!(of(FREE) - 1, total("free"), "{by:?}");
        assert_eq!(of(WHOLE) + of(POOL) - 2, total("whole"), "{by:?}");
        assert_eq!(of(CACHED) - 1, total("cached"), "{by:?}");
        assert_eq!(
            long + short + of(CACHED) - 9,
            total("long_lived") + total("short_lived"),
            "{by:?}"
        );
        if total("cached") == 0 {
            assert_eq!(long - 4, total("long_lived"), "{by:?}");
            assert_eq!(short - 4, total("short_lived"), "{by:?}");
        }
    }
    let text = run_ok(&a);
    assert!(
        text.contains(&format!("Picture: {path} ({squares} squares)")),
        "{text}"
    );
}

#[test]
fn svg_has_a_square_per_pageblock() {
    let dir = TempDir::new("frag-svg-toml");
    let toml = dir.put("two.toml", TWO_NODES);
    let toml = toml.to_str().unwrap();
    for workload in ["none", "guests"] {
        let mut a = vec!["frag", "--topology", toml, "--workload", workload];
        if workload != "none" {
            a.extend(["--max-gib", "1", "--rounds", "4"]);
        }
        check_svg(&a, true);
    }
    check_svg(
        &[
            "frag",
            "--preset",
            "fake-64",
            "--workload",
            "churn",
            "--rounds",
            "2",
        ],
        true,
    );
}

#[test]
fn svg_of_large_nodes_aggregates_pageblocks() {
    // 16 GiB nodes: 8192 pageblocks, two to a square.
    check_svg(&["frag", "--preset", "amd-4node"], false);
}

#[test]
fn bad_input_exits_2_with_one_line() {
    bad_input(&["frag"], "no topology given");
    bad_input(
        &["frag", "--preset", "amd-4node", "--workload", "compact"],
        "`--workload`: `compact` is not one of none, churn, guests",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "amd-4node",
            "--workload",
            "churn",
            "--seed",
            "x",
        ],
        "`--seed`: invalid value `x`",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "amd-4node",
            "--workload",
            "churn",
            "--seed",
            "-3",
        ],
        "`--seed` needs a value (N)",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "amd-4node",
            "--workload",
            "churn",
            "--rounds",
            "1001",
        ],
        "`--rounds`: invalid value `1001`",
    );
    bad_input(
        &["frag", "--preset", "amd-4node", "--rounds", "3"],
        "`--rounds` needs `--workload churn` or `--workload guests`",
    );
    bad_input(
        &["frag", "--preset", "amd-4node", "--seed", "3"],
        "`--seed` needs `--workload churn`",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "amd-4node",
            "--workload",
            "guests",
            "--max-gib",
            "0",
        ],
        "`--max-gib`: invalid value `0`",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "dual-socket-8node",
            "--workload",
            "churn",
            "--max-gib",
            "9",
        ],
        "`--max-gib 9`: the workload would use 72.0 GiB over 8 nodes, more than the 64 GiB",
    );
    bad_input(
        &[
            "frag",
            "--preset",
            "amd-4node",
            "--svg",
            "/nonexistent/dir/x.svg",
        ],
        "`--svg /nonexistent/dir/x.svg`: cannot create the file: ",
    );
    let dir = TempDir::new("frag-bad");
    let d = dir.path().to_str().unwrap();
    bad_input(
        &["frag", "--preset", "amd-4node", "--svg", d],
        &format!("`--svg {d}`: cannot create the file: "),
    );
    bad_input(
        &["frag", "--preset", "amd-4node", "--svg="],
        "`--svg` needs a value (FILE)",
    );
    bad_input(&["frag", "--preset", "nope"], "unknown preset `nope`");
    bad_input(
        &["frag", "--preset", "amd-4node", "--frob"],
        "unknown option `--frob` (see `numaframe help frag`)",
    );
}

#[test]
fn help_lists_the_workloads() {
    let out = run_ok(&["help", "frag"]);
    for w in [
        "none",
        "churn",
        "guests",
        "--svg",
        "--max-gib",
        "unusable_index",
    ] {
        assert!(out.contains(w), "{w}: {out}");
    }
    assert!(run_ok(&["help"]).contains("frag"));
}

/// cli.md: "`--svg FILE` writes an SVG". The machine is named after the TOML file's stem and the
/// title goes into the SVG unfiltered, so a control character in the file name (here U+0001)
/// makes a document that is not well-formed XML (XML 1.0 forbids it even as `&#1;`).
#[test]
fn svg_stays_well_formed_whatever_the_file_name() {
    let dir = TempDir::new("svg-name");
    let toml = dir
        .put(
            "c\u{1}d.toml",
            "distances = [[10]]\n[[node]]\nid = 0\ncpus = \"0\"\nmemory = \"1G\"\n",
        )
        .display()
        .to_string();
    let svg = dir.path().join("x.svg").display().to_string();
    let (code, _, err) = numaframe(&["frag", "--topology", &toml, "--svg", &svg]);
    assert_eq!((code, err.as_str()), (0, ""));
    let text = std::fs::read_to_string(&svg).unwrap();
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    assert!(bad.is_empty(), "control characters in the SVG: {bad:?}");
}

/// `doc` holds for `got`: every key of a documented object is in the output with that value,
/// a documented list is the start of the output's, and a documented number may be the output's
/// rounded to two decimals.
fn documented_part_matches(doc: &Value, got: &Value, at: &str) {
    match (doc, got) {
        (Value::Object(d), Value::Object(g)) => {
            for (k, v) in d {
                let g = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k}: not in the output"));
                documented_part_matches(v, g, &format!("{at}.{k}"));
            }
        }
        (Value::Array(d), Value::Array(g)) => {
            assert!(
                d.len() <= g.len(),
                "{at}: {} entries documented, {} output",
                d.len(),
                g.len()
            );
            for (i, (d, g)) in d.iter().zip(g).enumerate() {
                documented_part_matches(d, g, &format!("{at}[{i}]"));
            }
        }
        (Value::Number(d), Value::Number(g)) => {
            let (d, g) = (d.as_f64().unwrap(), g.as_f64().unwrap());
            assert!((d - g).abs() < 0.01, "{at}: documented {d}, output {g}");
        }
        _ => assert_eq!(doc, got, "{at}"),
    }
}

/// The contents of the first code block opening with `fence` after `intro` in docs/cli.md.
fn cli_md_example(intro: &str, fence: &str) -> String {
    let cli_md =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    let from = cli_md.find(intro).expect("the example's introduction");
    let block = &cli_md[from..];
    let start = block.find(fence).expect("the example's block") + fence.len();
    block[start..start + block[start..].find("```").unwrap()].to_string()
}

/// docs/cli.md's `frag` JSON example is the output of the command it names: the values of the
/// entries it shows (one of each list) are node 0's, its first zone's and the metadata's.
#[test]
fn the_documented_json_example_is_what_the_command_prints() {
    let example = cli_md_example(
        "JSON (`--preset fake-64 --workload churn --rounds 2 --svg\nx.svg`",
        "```json\n",
    );
    let doc: Value = serde_json::from_str(&example.replace(",…", "")).expect("the example");

    let dir = TempDir::new("frag-doc");
    let svg = dir.path().join("x.svg");
    let (code, out, err) = numaframe(&[
        "frag",
        "--preset",
        "fake-64",
        "--workload",
        "churn",
        "--rounds",
        "2",
        "--svg",
        svg.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["svg"]["file"].as_str(), svg.to_str());
    got["svg"]["file"] = "x.svg".into();
    documented_part_matches(&doc, &got, "frag");
}

/// docs/cli.md's `frag` text example is what the command it names prints: each of its lines
/// (node 0's unusable-index and block-type lines, the table's header and the metadata) is a
/// line of the output.
#[test]
fn the_documented_text_example_is_what_the_command_prints() {
    let example = cli_md_example(
        "`numaframe frag --preset amd-4node --workload churn`):",
        "```\n",
    );

    let out = run_ok(&["frag", "--preset", "amd-4node", "--workload", "churn"]);
    let lines: Vec<&str> = out.lines().collect();
    let documented: Vec<&str> = example.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(documented.len(), 6, "the example's lines: {example}");
    for line in documented {
        assert!(
            lines.contains(&line),
            "documented but not printed: {line:?}\n{out}"
        );
    }
}
