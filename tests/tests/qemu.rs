//! Boots the `numaframe-unikernel` example under `qemu-system-aarch64 -M virt` (every CPU at once,
//! multi-threaded TCG) and under `qemu-system-x86_64 -M q35` (PVH) with NUMA layouts given as
//! `-numa` options, and checks what it prints over its serial console:
//! - the kernel-format fallback lines equal the reference (the seed's 4-node table from
//!   `vectors/zonelists.json`) and what `numaframe zonelists` prints for the same layout;
//! - with `numaframe.linux_boot_order` they equal Linux's boot-time order (Linux 6.7 and later:
//!   a memoryless node is never in a list, its own included), computed by the O(N³) oracle;
//! - huge pages from `hugepages=`, the policy runs and the heap all report success; every CPU
//!   ran the SMP workload (aarch64 starts them through PSCI, x86_64 through INIT-SIPI-SIPI, each
//!   reporting in), its claimed-handle phase woke every idle CPU that held frames (through the
//!   unikernel's `CpuKick`), and the boot CPU's invariant and free-count checks passed; a `FAILED` line
//!   from any CPU fails the test with that line; QEMU exits with status 0 after PSCI
//!   `SYSTEM_OFF` on aarch64, with 33 through `isa-debug-exit` on x86_64;
//! - on x86_64 the nodes are numbered as x86 Linux numbers them from QEMU's SRAT (processor
//!   domains first), so the lines equal the CLI's and the oracle's for the layout renumbered
//!   that way, and a SLIT with a remote distance of 10 is rejected as Linux rejects it;
//! - the `defmt` build logs its boot events over semihosting, and `defmt-decoder` (what
//!   `defmt-print` runs) decodes them with the ELF's table into the same fallback orders.
//!
//! The tests need `qemu-system-aarch64` and `qemu-system-x86_64` on `PATH` (Debian's
//! `qemu-system-arm` and `qemu-system-x86`; `scripts/test.sh` installs them) and fail with a
//! message saying so when one is missing. They build the unikernel themselves (`cargo build
//! --release -p numaframe-unikernel --target aarch64-unknown-none`, and `x86_64-unknown-none`)
//! into `target/unikernel` (and `target/unikernel-defmt`), target directories of their own so
//! the build does not wait for the lock that the running `cargo test` holds; `scripts/test.sh`
//! builds them there beforehand.

mod qemu_support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use numaframe_testkit::TempDir;
use numaframe_tests::oracle::{Tables, build_all_zonelists};
use qemu_support::{Arch, Layout, run_arch, run_arch_in, workspace};

const TIMEOUT: Duration = Duration::from_secs(60);
const OK: &str = "numaframe-unikernel: ok:";
/// QEMU's exit status when the x86 kernel writes its success code (0x10) to `isa-debug-exit`.
const X86_SUCCESS: i32 = 33;

/// Builds the unikernel for `arch` (with `features`) into `target/<dir>` and returns the ELF.
fn build(arch: Arch, dir: &str, features: &[&str]) -> PathBuf {
    let ws = workspace();
    let target_dir = ws.join("target").join(dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut args = vec![
        "build",
        "--release",
        "--quiet",
        "-p",
        "numaframe-unikernel",
        "--target",
        arch.target(),
    ];
    let list = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", &list]);
    }
    let status = Command::new(cargo)
        .current_dir(&ws)
        .env("CARGO_TARGET_DIR", &target_dir)
        .args(&args)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the unikernel failed: {status}");
    let elf = target_dir.join(format!("{}/release/numaframe-unikernel", arch.target()));
    assert!(elf.is_file(), "no ELF at {}", elf.display());
    elf
}

/// The unikernel ELF for `arch`, built once per test binary.
fn elf(arch: Arch) -> PathBuf {
    static AARCH64: OnceLock<PathBuf> = OnceLock::new();
    static X86_64: OnceLock<PathBuf> = OnceLock::new();
    let cell = match arch {
        Arch::Aarch64 => &AARCH64,
        Arch::X86_64 => &X86_64,
    };
    cell.get_or_init(|| build(arch, "unikernel", &[])).clone()
}

/// QEMU's arguments to boot the unikernel on `layout` with `bootargs`, console on stdio.
fn console_args(arch: Arch, layout: &Layout, bootargs: &str) -> Vec<String> {
    elf_args(arch, &elf(arch), layout, bootargs)
}

/// [`console_args`] for a given ELF (or any kernel QEMU boots).
fn elf_args(arch: Arch, elf: &Path, layout: &Layout, bootargs: &str) -> Vec<String> {
    let mut args = layout.machine_args(arch);
    args.extend(kernel_args(elf, bootargs));
    args
}

/// The kernel, its command line and the console on the serial port, after the machine's
/// arguments.
fn kernel_args(elf: &Path, bootargs: &str) -> [String; 11] {
    [
        "-kernel",
        elf.to_str().expect("UTF-8 path"),
        "-append",
        bootargs,
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
    ]
    .map(String::from)
}

/// Boots the unikernel for `arch` on `layout` with `bootargs`; returns the console text after
/// checking that the run passed (its SMP run on every CPU included) and that QEMU's exit status
/// says so.
fn boot(arch: Arch, layout: &Layout, bootargs: &str) -> String {
    let run = run_arch(arch, &console_args(arch, layout, bootargs), TIMEOUT);
    let text = run.stdout.replace('\r', "");
    // Whichever CPU failed (its workload, an exception, a CPU that did not report in), its line
    // is the message.
    if let Some(failed) = text
        .lines()
        .find(|l| l.contains("numaframe-unikernel: FAILED: "))
    {
        panic!("{failed}\n(exit {}){}\n{text}", run.status, run.stderr);
    }
    let exited_ok = match arch {
        Arch::Aarch64 => run.status.success(),
        Arch::X86_64 => run.status.code() == Some(X86_SUCCESS),
    };
    assert!(
        exited_ok,
        "qemu exited with {}: {}\n{text}",
        run.status, run.stderr
    );
    assert!(
        text.lines().any(|l| l.starts_with(OK)),
        "the unikernel did not report success:\n{text}"
    );
    let cpus = layout.cpus();
    let smp = format!("numaframe-unikernel: smp: {cpus} of {cpus} CPUs ran: {cpus} CPUs x ");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&smp) && l.contains("; caches drained, invariants hold, ")),
        "the SMP run and its checks did not pass on {cpus} CPUs:\n{text}"
    );
    // Every CPU but the boot CPU idled holding its claimed cache, and was woken by a kick to
    // give it back.
    let idle = cpus - 1;
    let woken =
        format!(" kicks, {idle} of {idle} idle CPUs holding frames woken to give them back");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&smp) && l.ends_with(&woken)),
        "the claimed-handle phase did not wake the {idle} idle CPUs:\n{text}"
    );
    if arch == Arch::X86_64 {
        let started = text
            .lines()
            .filter(|l| l.contains(") started through the trampoline at "))
            .count();
        assert_eq!(
            started,
            cpus - 1,
            "every CPU but the boot CPU reported in after INIT-SIPI-SIPI:\n{text}"
        );
    }
    text
}

fn fallback_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("Fallback order for Node "))
        .collect()
}

/// What `numaframe zonelists --topology FILE [--linux-boot-order]` prints for `layout`.
fn cli_zonelists(layout: &Layout, linux_boot_order: bool, name: &str) -> String {
    let dir = TempDir::new(name);
    let path = dir.put("layout.toml", &layout.toml());
    let mut args: Vec<OsString> = ["zonelists", "--topology"].map(OsString::from).to_vec();
    args.push(path.into_os_string());
    if linux_boot_order {
        args.push("--linux-boot-order".into());
    }
    let mut out = Vec::new();
    numaframe_hosted::cli::run(&args, &mut out).expect("numaframe zonelists runs");
    String::from_utf8(out).expect("UTF-8")
}

/// The oracle's lines for `layout` (a plain transcription of Linux's `build_zonelists()`).
fn oracle_lines(layout: &Layout, linux_boot_order: bool) -> Vec<String> {
    let t = Tables {
        distances: layout.distances.iter().flatten().copied().collect(),
        has_cpus: layout.nodes.iter().map(|n| !n.cpus.is_empty()).collect(),
        has_memory: layout.nodes.iter().map(|n| n.mem_mib > 0).collect(),
    };
    build_all_zonelists(&t, linux_boot_order)
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let ids: Vec<String> = row.iter().map(usize::to_string).collect();
            format!("Fallback order for Node {i}: {}", ids.join(" "))
        })
        .collect()
}

/// The seed's table from `vectors/zonelists.json`, as boot-log lines.
fn vector_lines(case: &str) -> Vec<String> {
    let path = workspace().join("tests/vectors/zonelists.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read the vectors"))
            .expect("valid JSON");
    let case = doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == case)
        .expect("the case exists");
    case["fallback"]
        .as_array()
        .expect("fallback rows")
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let ids: Vec<String> = row
                .as_array()
                .expect("a row")
                .iter()
                .map(|v| v.as_u64().expect("a node id").to_string())
                .collect();
            format!("Fallback order for Node {i}: {}", ids.join(" "))
        })
        .collect()
}

#[test]
fn amd_4node_prints_the_seed_table() {
    let layout = Layout::amd_4node();
    let text = boot(
        Arch::Aarch64,
        &layout,
        "hugepagesz=2M hugepages=8 numaframe.weights=3,3,1,1",
    );
    println!("{text}");
    let lines = fallback_lines(&text);
    assert_eq!(lines, vector_lines("amd-4node"));
    assert_eq!(
        lines.join("\n") + "\n",
        cli_zonelists(&layout, false, "amd"),
        "the same lines as `numaframe zonelists`"
    );
    assert!(
        text.contains("numaframe-unikernel: device tree at 0x40000000"),
        "QEMU puts the tree at the base of RAM for a bare ELF:\n{text}"
    );
    assert!(text.contains("HugeTLB: registered 2.00 MiB page size, pre-allocated 8 pages"));
    for node in 0..4 {
        assert!(
            text.contains(&format!("HugeTLB: node {node}: 2 x 2.00 MiB, 0 x 1.00 GiB")),
            "8 balanced pages are 2 per node:\n{text}"
        );
    }
    for policy in [
        "local",
        "preferred",
        "preferred-many",
        "bind",
        "interleave",
        "weighted-interleave",
    ] {
        assert!(
            text.contains(&format!("policy {policy}: ")),
            "{policy}:\n{text}"
        );
    }
    assert!(
        text.contains("policy local: 784 frames on nodes 0:784"),
        "{text}"
    );
    assert!(
        text.contains("heap: node 0: "),
        "the heap grew on node 0:\n{text}"
    );
    assert!(
        text.contains("scrub: cleared ") && text.contains("; zeroed frames read zero"),
        "the boot CPU scrubbed and a dirtied frame came back zeroed:\n{text}"
    );
}

#[test]
fn cpuless_and_memoryless_nodes_match_the_cli_and_linux_boot_order() {
    let layout = Layout::cpuless_memoryless();
    let text = boot(Arch::Aarch64, &layout, "hugepages=0:1,2:3");
    let lines = fallback_lines(&text);
    assert_eq!(
        lines.join("\n") + "\n",
        cli_zonelists(&layout, false, "mixed")
    );
    assert_eq!(lines, oracle_lines(&layout, false));
    assert!(text.contains("HugeTLB: node 2: 3 x 2.00 MiB"), "{text}");
    assert!(
        text.contains("numaframe-unikernel: numaframe manages ") && text.contains(" on 3 nodes"),
        "three nodes have memory:\n{text}"
    );

    let boot_order = boot(Arch::Aarch64, &layout, "numaframe.linux_boot_order");
    let linux = fallback_lines(&boot_order);
    assert_eq!(
        linux.join("\n") + "\n",
        cli_zonelists(&layout, true, "mixed-boot")
    );
    assert_eq!(linux, oracle_lines(&layout, true));
    assert_ne!(
        lines, linux,
        "the CPU penalty changes this layout's order, so the bootarg must show"
    );
    // Linux 6.7+: the memoryless node 3 lists the others, and no list holds it.
    assert!(linux[3].starts_with("Fallback order for Node 3: ") && !linux[3].ends_with(" 3"));
    assert!(
        linux
            .iter()
            .all(|l| !l.split(": ").nth(1).unwrap_or("").contains('3'))
    );
}

#[test]
fn a_bad_bootarg_is_reported_and_qemu_still_exits() {
    let run = run_arch(
        Arch::Aarch64,
        &console_args(Arch::Aarch64, &Layout::amd_4node(), "numaframe.bogus"),
        TIMEOUT,
    );
    assert!(
        run.stdout
            .contains("numaframe-unikernel: FAILED: bad bootarg `numaframe.bogus`"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(OK));
}

#[test]
fn the_defmt_build_logs_boot_events_that_decode() {
    let elf = build(Arch::Aarch64, "unikernel-defmt", &["defmt"]);
    let dir = TempDir::new("defmt");
    let layout = Layout::amd_4node();
    let mut args = elf_args(Arch::Aarch64, &elf, &layout, "hugepages=4");
    args.extend(["-semihosting-config", "enable=on,target=native"].map(String::from));
    // Semihosting opens `defmt.bin` relative to QEMU's working directory.
    let run = run_arch_in(Arch::Aarch64, &args, TIMEOUT, dir.path());
    assert!(
        run.status.success() && run.stdout.contains(OK),
        "{}",
        run.stdout
    );

    let frames =
        std::fs::read(dir.path().join("defmt.bin")).expect("the unikernel wrote defmt.bin");
    let table = defmt_decoder::Table::parse(&std::fs::read(&elf).expect("read the ELF"))
        .expect("a defmt table")
        .expect("the ELF has defmt data");
    let mut decoder = table.new_stream_decoder();
    decoder.received(&frames);
    let mut messages = Vec::new();
    loop {
        match decoder.decode() {
            Ok(frame) => messages.push(frame.display_message().to_string()),
            Err(defmt_decoder::DecodeError::UnexpectedEof) => break,
            Err(e) => panic!("malformed defmt stream after {messages:?}: {e:?}"),
        }
    }
    let text = messages.join("\n");
    println!("{text}");
    assert!(text.starts_with("numaframe booted: 4 nodes, "), "{text}");
    // The same orders as the UART lines, through the core's `defmt::Format` for `NodeId`.
    for (node, row) in [[0, 1, 2, 3], [1, 0, 3, 2], [2, 3, 0, 1], [3, 2, 1, 0]]
        .iter()
        .enumerate()
    {
        let ids: Vec<String> = row.iter().map(|n| format!("NodeId({n})")).collect();
        let want = format!(
            "fallback order for node NodeId({node}): [{}]",
            ids.join(", ")
        );
        assert!(messages.contains(&want), "missing `{want}` in\n{text}");
    }
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("node NodeId(3) owns PhysRange")),
        "{text}"
    );
    assert!(
        messages.contains(&"node NodeId(2) holds 1 pages of Size2M".to_string()),
        "{text}"
    );
    assert_eq!(
        messages.last().map(String::as_str),
        Some("all checks passed, powering off")
    );
}

/// Six nodes with asymmetric distances, two CPU-less nodes and a memoryless one.
fn mixed_6node() -> Layout {
    let nodes = [
        (256, vec![0]),
        (256, vec![1]),
        (256, vec![]),
        (0, vec![2]),
        (256, vec![]),
        (256, vec![3]),
    ];
    Layout {
        nodes: nodes
            .into_iter()
            .map(|(mem_mib, cpus)| qemu_support::NodeDesc { mem_mib, cpus })
            .collect(),
        distances: (0..6)
            .map(|i| {
                (0..6)
                    .map(|j| {
                        if i == j {
                            10
                        } else {
                            12 + ((i * 7 + j * 3) % 5) as u8 * 4
                        }
                    })
                    .collect()
            })
            .collect(),
    }
}

/// The fallback lines Linux printed, without timestamps and trailing spaces, and its version.
fn linux_lines(text: &str) -> ((u32, u32), Vec<String>) {
    let version = text
        .lines()
        .find_map(|l| l.split("Linux version ").nth(1))
        .and_then(|v| {
            let mut parts = v.split(['.', '-', ' ']);
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
        })
        .unwrap_or_else(|| panic!("no `Linux version` line in\n{text}"));
    (version, log_lines(text, &["Fallback order for Node "]))
}

/// The lines of `text` (a kernel log) that start with one of `prefixes` once a timestamp is cut
/// off, without trailing spaces.
fn log_lines(text: &str, prefixes: &[&str]) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            prefixes
                .iter()
                .filter_map(|p| l.find(p))
                .min()
                .map(|i| l[i..].trim_end().to_string())
        })
        .collect()
}

/// The SRAT lines (the node of each memory range's proximity domain) that Linux x86 prints at
/// the default log level and the x86 unikernel prints the same way. (Linux's processor lines,
/// `SRAT: PXM P -> APIC A -> Node N`, are not in its default boot log.)
const SRAT_LINES: [&str; 1] = ["ACPI: SRAT: Node "];

/// The Debian kernels for `arch` in `target/linux` (or `NUMAFRAME_LINUX_KERNELS`, paths
/// separated by `:`, whose names end in `-arm64.vmlinuz` or `-amd64.vmlinuz`).
fn linux_kernels(arch: Arch) -> Vec<PathBuf> {
    let suffix = match arch {
        Arch::Aarch64 => "-arm64.vmlinuz",
        Arch::X86_64 => "-amd64.vmlinuz",
    };
    let all: Vec<PathBuf> = match std::env::var_os("NUMAFRAME_LINUX_KERNELS") {
        Some(list) => std::env::split_paths(&list).collect(),
        None => std::fs::read_dir(workspace().join("target/linux"))
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default(),
    };
    all.into_iter()
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(suffix)))
        .collect()
}

/// Boots each Debian kernel for `arch` on the test layouts and checks that the unikernel with
/// `numaframe.linux_boot_order` prints Linux's boot-time fallback lines, line for line, and on
/// x86 its SRAT lines too. Before Linux 6.7 a memoryless node comes first in its own list; that
/// one difference is allowed for them.
fn compare_with_linux(arch: Arch) {
    let kernels = linux_kernels(arch);
    assert!(
        !kernels.is_empty(),
        "no {arch:?} kernels: run examples/unikernel/scripts/fetch-linux.sh or set NUMAFRAME_LINUX_KERNELS"
    );
    let console = match arch {
        Arch::Aarch64 => "console=ttyAMA0 panic=-1",
        Arch::X86_64 => "console=ttyS0 panic=-1",
    };
    for layout in [
        Layout::amd_4node(),
        Layout::cpuless_memoryless(),
        mixed_6node(),
    ] {
        let text = boot(arch, &layout, "numaframe.linux_boot_order");
        let ours: Vec<String> = fallback_lines(&text)
            .into_iter()
            .map(String::from)
            .collect();
        // Linux's node of each line, to find the memoryless ones.
        let numbering = match arch {
            Arch::Aarch64 => (0..layout.nodes.len()).collect(),
            Arch::X86_64 => x86_numbering(&layout),
        };
        for kernel in &kernels {
            let args = elf_args(arch, kernel, &layout, console);
            let run = run_arch(arch, &args, Duration::from_secs(300));
            let log = run.stdout.replace('\r', "");
            let ((major, minor), linux) = linux_lines(&log);
            let want: Vec<String> = ours
                .iter()
                .enumerate()
                .map(|(node, line)| {
                    let memoryless = layout.nodes[numbering[node]].mem_mib == 0;
                    if memoryless && (major, minor) < (6, 7) {
                        let (head, order) = line.split_once(": ").expect("a fallback line");
                        format!("{head}: {node} {order}")
                    } else {
                        line.clone()
                    }
                })
                .collect();
            println!(
                "Linux {major}.{minor} ({arch:?}) on {} nodes:\n{}",
                layout.nodes.len(),
                linux.join("\n")
            );
            assert_eq!(linux, want, "Linux {major}.{minor} ({})", kernel.display());
            if arch == Arch::X86_64 {
                let theirs = log_lines(&log, &SRAT_LINES);
                println!("{}", theirs.join("\n"));
                assert_eq!(
                    theirs,
                    log_lines(&text, &SRAT_LINES),
                    "SRAT lines of Linux {major}.{minor}"
                );
            }
        }
    }
}

/// Opt-in: Debian's arm64 cloud kernels (fetch them with
/// `examples/unikernel/scripts/fetch-linux.sh arm64`) against the aarch64 unikernel.
#[test]
#[ignore = "boots real Linux kernels: run examples/unikernel/scripts/fetch-linux.sh first"]
fn linux_prints_the_same_boot_order() {
    compare_with_linux(Arch::Aarch64);
}

/// Opt-in: Debian's amd64 cloud kernels (`examples/unikernel/scripts/fetch-linux.sh amd64`)
/// against the x86 unikernel: the fallback lines and the SRAT node mapping.
#[test]
#[ignore = "boots real Linux kernels: run examples/unikernel/scripts/fetch-linux.sh amd64 first"]
fn linux_x86_prints_the_same_boot_order_and_srat_mapping() {
    compare_with_linux(Arch::X86_64);
}

#[test]
fn six_asymmetric_nodes_match_the_cli_both_ways() {
    let layout = mixed_6node();
    for (bootargs, linux_boot_order) in [("", false), ("numaframe.linux_boot_order", true)] {
        let text = boot(Arch::Aarch64, &layout, bootargs);
        let lines = fallback_lines(&text);
        assert_eq!(
            lines.join("\n") + "\n",
            cli_zonelists(&layout, linux_boot_order, "six"),
            "{bootargs}"
        );
        assert_eq!(lines, oracle_lines(&layout, linux_boot_order), "{bootargs}");
    }
}

/// x86 Linux's numbering of a QEMU layout: entry `i` is the QEMU node (proximity domain) that
/// Linux calls node `i`. QEMU's SRAT lists the processors in CPU order, then the memory of each
/// node with memory in node order, with the node id as proximity domain; Linux numbers the
/// domains in the order it meets them, all processors first.
fn x86_numbering(layout: &Layout) -> Vec<usize> {
    let mut cpus: Vec<(u32, usize)> = layout
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(node, n)| n.cpus.iter().map(move |c| (*c, node)))
        .collect();
    cpus.sort_unstable();
    let mut order = Vec::new();
    let memory = (0..layout.nodes.len()).filter(|n| layout.nodes[*n].mem_mib > 0);
    for node in cpus.into_iter().map(|(_, node)| node).chain(memory) {
        if !order.contains(&node) {
            order.push(node);
        }
    }
    order
}

/// `layout` with its nodes renumbered: node `i` is `layout`'s node `order[i]`.
fn renumbered(layout: &Layout, order: &[usize]) -> Layout {
    Layout {
        nodes: order.iter().map(|n| layout.nodes[*n].clone()).collect(),
        distances: order
            .iter()
            .map(|a| order.iter().map(|b| layout.distances[*a][*b]).collect())
            .collect(),
    }
}

/// `(node, pxm)` of every `ACPI: SRAT: Node N PXM P` line.
fn srat_nodes(text: &str) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ACPI: SRAT: Node "))
        .filter_map(|rest| {
            let mut words = rest.split(' ');
            let node = words.next()?.parse().ok()?;
            (words.next()? == "PXM").then_some(())?;
            Some((node, words.next()?.parse().ok()?))
        })
        .collect();
    pairs.dedup();
    pairs
}

#[test]
fn x86_amd_4node_prints_the_seed_table() {
    let layout = Layout::amd_4node();
    assert_eq!(x86_numbering(&layout), [0, 1, 2, 3]);
    let text = boot(
        Arch::X86_64,
        &layout,
        "hugepagesz=2M hugepages=8 numaframe.weights=3,3,1,1",
    );
    println!("{text}");
    assert!(
        text.contains("scrub: cleared ") && text.contains("; zeroed frames read zero"),
        "the boot CPU scrubbed (rep stosb) and a dirtied frame came back zeroed:\n{text}"
    );
    let lines = fallback_lines(&text);
    assert_eq!(lines, vector_lines("amd-4node"));
    assert_eq!(
        lines.join("\n") + "\n",
        cli_zonelists(&layout, false, "x86-amd"),
        "the same lines as `numaframe zonelists`"
    );
    assert_eq!(srat_nodes(&text), [(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert!(
        text.contains("numaframe-unikernel: page tables: ")
            && text.contains("table frames and gave them back"),
        "the kernel runs on page tables from numaframe frames:\n{text}"
    );
    for node in 0..4 {
        assert!(
            text.contains(&format!("HugeTLB: node {node}: 2 x 2.00 MiB, 0 x 1.00 GiB")),
            "8 balanced pages are 2 per node:\n{text}"
        );
    }
    assert!(
        text.contains("policy local: 784 frames on nodes 0:784"),
        "{text}"
    );
    assert!(text.contains("policy weighted-interleave: "), "{text}");
}

#[test]
fn x86_nodes_are_numbered_as_linux_numbers_them() {
    let mixed = Layout::cpuless_memoryless();
    // Processors first: PXM 0, 1, then 3 (CPUs 2 and 3, no memory); then PXM 2 (memory only).
    assert_eq!(x86_numbering(&mixed), [0, 1, 3, 2]);
    for (layout, name) in [(mixed, "x86-mixed"), (mixed_6node(), "x86-six")] {
        let order = x86_numbering(&layout);
        let linux = renumbered(&layout, &order);
        for (bootargs, linux_boot_order) in [("", false), ("numaframe.linux_boot_order", true)] {
            let text = boot(Arch::X86_64, &layout, bootargs);
            let lines = fallback_lines(&text);
            assert_eq!(
                lines.join("\n") + "\n",
                cli_zonelists(&linux, linux_boot_order, name),
                "{name} {bootargs}:\n{text}"
            );
            assert_eq!(
                lines,
                oracle_lines(&linux, linux_boot_order),
                "{name} {bootargs}"
            );
            let mut want: Vec<(usize, usize)> = order
                .iter()
                .enumerate()
                .filter(|(_, pxm)| layout.nodes[**pxm].mem_mib > 0)
                .map(|(node, pxm)| (node, *pxm))
                .collect();
            want.sort_by_key(|(_, pxm)| *pxm);
            assert_eq!(srat_nodes(&text), want, "{name}: the SRAT mapping:\n{text}");
        }
    }
}

#[test]
fn x86_a_slit_with_a_remote_distance_of_ten_is_not_used() {
    let layout = Layout {
        nodes: (0..3)
            .map(|i| qemu_support::NodeDesc {
                mem_mib: 256,
                cpus: vec![i],
            })
            .collect(),
        distances: vec![vec![10, 10, 30], vec![10, 10, 25], vec![30, 25, 10]],
    };
    let text = boot(Arch::X86_64, &layout, "");
    assert!(
        text.contains("ACPI: SLIT table looks invalid. Not used."),
        "{text}"
    );
    let linux = Layout {
        distances: vec![vec![10, 20, 20], vec![20, 10, 20], vec![20, 20, 10]],
        ..layout
    };
    assert_eq!(fallback_lines(&text), oracle_lines(&linux, false));
}

#[test]
fn x86_a_bad_bootarg_is_reported_and_qemu_exits_with_failure() {
    let run = run_arch(
        Arch::X86_64,
        &console_args(Arch::X86_64, &Layout::amd_4node(), "numaframe.bogus"),
        TIMEOUT,
    );
    assert!(
        run.stdout
            .contains("numaframe-unikernel: FAILED: bad bootarg `numaframe.bogus`"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.status.code(),
        Some(35),
        "isa-debug-exit with the failure code"
    );
    assert!(!run.stdout.contains(OK));
}

/// The tree QEMU builds for `layout` on aarch64 `virt`, with `extra` `/memreserve/` entries
/// inserted into its reservation block (its structure and strings blocks moved up to match).
fn tree_with_memreserves(layout: &Layout, extra: &[(u64, u64)], dir: &TempDir) -> PathBuf {
    let dtb = dir.path().join("virt.dtb");
    let mut args = layout.machine_args(Arch::Aarch64);
    let machine = args.iter().position(|a| a == "virt").expect("-M virt");
    args[machine] = format!("virt,dumpdtb={}", dtb.display());
    args.extend(
        [
            "-kernel",
            elf(Arch::Aarch64).to_str().expect("UTF-8 path"),
            "-display",
            "none",
        ]
        .map(String::from),
    );
    let run = qemu_support::run_qemu(&args, TIMEOUT);
    assert!(run.status.success(), "dumpdtb: {}", run.stderr);
    let mut t = std::fs::read(&dtb).expect("QEMU wrote the tree");
    let word = |t: &[u8], at: usize| u32::from_be_bytes(t[at..at + 4].try_into().unwrap());
    let rsv = word(&t, 16) as usize;
    let added: Vec<u8> = extra
        .iter()
        .flat_map(|&(b, s)| b.to_be_bytes().into_iter().chain(s.to_be_bytes()))
        .collect();
    t.splice(rsv..rsv, added.iter().copied());
    for field in [4usize, 8, 12] {
        let v = word(&t, field) + added.len() as u32;
        t[field..field + 4].copy_from_slice(&v.to_be_bytes());
    }
    let out = dir.path().join("reserved.dtb");
    std::fs::write(&out, &t).expect("write the tree");
    out
}

/// The aarch64 kernel keeps room for 14 tree reservations and says it fails with "more than 14
/// memory reservations" beyond that; it must never hand a reservation it dropped to numaframe.
#[test]
fn every_device_tree_reservation_is_kept_out_or_the_boot_fails() {
    let layout = Layout {
        nodes: vec![
            qemu_support::NodeDesc {
                mem_mib: 512,
                cpus: vec![0],
            },
            qemu_support::NodeDesc {
                mem_mib: 512,
                cpus: vec![1],
            },
        ],
        distances: vec![vec![10, 20], vec![20, 10]],
    };
    let dir = TempDir::new("memreserve");
    // 20 reservations of one frame each, back to back in node 0's RAM
    // (0x4000_0000..0x6000_0000), so that carving them leaves no small pieces.
    let extra: Vec<(u64, u64)> = (0..20)
        .map(|i| (0x5000_0000 + i * 0x1000, 0x1000))
        .collect();
    let dtb = tree_with_memreserves(&layout, &extra, &dir);
    // With `-dtb` QEMU does not place a tree for an ELF itself: load ours at the base of RAM,
    // where the kernel looks for it.
    let mut args = console_args(Arch::Aarch64, &layout, "");
    let dtb = dtb.to_str().unwrap();
    args.extend([
        "-dtb".to_string(),
        dtb.to_string(),
        "-device".to_string(),
        format!("loader,file={dtb},addr=0x40000000,force-raw=on"),
    ]);
    let run = run_arch(Arch::Aarch64, &args, TIMEOUT);
    let text = run.stdout.replace('\r', "");
    let reserved_line = text
        .lines()
        .find(|l| l.contains(" KiB in ") && l.contains("reserved"))
        .unwrap_or("");
    assert!(
        text.contains("more than 14 memory reservations")
            || reserved_line.ends_with(" in 22 ranges"),
        "20 tree reservations (+ the tree and the image): either all kept out or the boot fails;\n\
         the kernel said: {reserved_line:?}\n{text}"
    );
}

/// Boots the x86 kernel on q35 with one CPU and 512 MiB and no `-numa` option (so QEMU builds
/// no SRAT), adding `srat_body` (the bytes after the SRAT's 36-byte header) as an SRAT through
/// `-acpitable` when given; returns the console text.
fn x86_boot_with_srat(srat_body: Option<&[u8]>, dir: &TempDir) -> String {
    let mut args: Vec<String> = [
        "-M",
        "q35",
        "-device",
        "isa-debug-exit",
        "-accel",
        "tcg,thread=multi",
        "-smp",
        "1",
        "-m",
        "512M",
    ]
    .map(String::from)
    .to_vec();
    args.extend(kernel_args(&elf(Arch::X86_64), ""));
    if let Some(body) = srat_body {
        let file = dir.path().join("srat.bin");
        std::fs::write(&file, body).expect("write the SRAT");
        args.extend([
            "-acpitable".to_string(),
            format!("sig=SRAT,rev=3,data={}", file.display()),
        ]);
    }
    run_arch(Arch::X86_64, &args, TIMEOUT)
        .stdout
        .replace('\r', "")
}

/// The 12 reserved bytes that open an SRAT's body (the first is 1, as ACPI asks).
fn srat_reserved() -> Vec<u8> {
    let mut b = vec![0u8; 12];
    b[0] = 1;
    b
}

/// An enabled local APIC affinity entry for APIC 0 in domain `pxm`.
fn srat_cpu(pxm: u8) -> Vec<u8> {
    vec![0, 16, pxm, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// An enabled memory affinity entry.
fn srat_memory(pxm: u32, base: u64, length: u64) -> Vec<u8> {
    let mut e = vec![1u8, 40];
    e.extend(pxm.to_le_bytes());
    e.extend([0, 0]);
    e.extend(base.to_le_bytes());
    e.extend(length.to_le_bytes());
    e.extend([0; 4]);
    e.extend(1u32.to_le_bytes());
    e.extend([0; 8]);
    e
}

/// Linux uses an SRAT only if it names memory and its memory ranges cover the e820 RAM
/// (`acpi_numa_init`: no memory affinity → `-ENOENT`; `numa_meminfo_cover_memory`: "NUMA:
/// nodes only cover …MB of your …MB e820 RAM. Not used."); otherwise it boots as without one
/// (`dummy_numa_init`: one node with all RAM and every CPU). The unikernel says it numbers and
/// lays out the machine by Linux's rules, so such an SRAT must give what no SRAT gives.
#[test]
fn x86_an_srat_that_linux_refuses_gives_the_machine_without_numa() {
    let dir = TempDir::new("srat-refused");
    let summary = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| {
                l.starts_with("numaframe-unikernel: numaframe manages ")
                    || l.starts_with("Fallback order for Node ")
                    || l.contains("FAILED")
            })
            .map(String::from)
            .collect()
    };
    let plain = x86_boot_with_srat(None, &dir);
    assert!(plain.lines().any(|l| l.starts_with(OK)), "{plain}");
    let want = summary(&plain);

    // Processors only, no memory affinity.
    let mut cpu_only = srat_reserved();
    cpu_only.extend(srat_cpu(0));
    let text = x86_boot_with_srat(Some(&cpu_only), &dir);
    assert_eq!(summary(&text), want, "an SRAT without memory:\n{text}");

    // Memory affinity for only the first 256 MiB of 512.
    let mut half = srat_reserved();
    half.extend(srat_cpu(0));
    half.extend(srat_memory(0, 0, 256 << 20));
    let text = x86_boot_with_srat(Some(&half), &dir);
    assert_eq!(
        summary(&text),
        want,
        "an SRAT covering half the RAM:\n{text}"
    );
}

/// Two SRAT processor entries for one APIC id: Linux's `set_apicid_to_node` keeps the last
/// (`__apicid_to_node[apic_id] = node`, entry after entry), so the CPU is on the second entry's
/// node, and local allocations land there.
#[test]
fn x86_a_cpu_named_twice_in_the_srat_is_on_the_node_of_its_last_entry() {
    let dir = TempDir::new("srat-dup-cpu");
    let mut body = srat_reserved();
    body.extend(srat_cpu(0));
    body.extend(srat_cpu(1));
    body.extend(srat_memory(0, 0, 256 << 20));
    body.extend(srat_memory(1, 256 << 20, 256 << 20));
    let text = x86_boot_with_srat(Some(&body), &dir);
    let local = text
        .lines()
        .find(|l| l.starts_with("policy local: "))
        .unwrap_or_else(|| panic!("no local policy line:\n{text}"));
    assert!(
        local.ends_with(" on nodes 1:") || local.contains(" on nodes 1:"),
        "APIC 0's last SRAT entry is PXM 1 (node 1): {local}\n{text}"
    );
}
