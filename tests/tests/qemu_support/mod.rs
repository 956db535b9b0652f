//! Shared by the QEMU tests (`qemu.rs`, `fdt.rs`): NUMA layouts as QEMU options (for the
//! aarch64 `virt` machine and the x86_64 `q35` machine) and as the hosted CLI's TOML, and
//! running `qemu-system-aarch64` or `qemu-system-x86_64` with a timeout.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The QEMU system emulator and machine a test boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `qemu-system-aarch64 -M virt -cpu cortex-a57`, every CPU a host thread.
    Aarch64,
    /// `qemu-system-x86_64 -M q35` with the `isa-debug-exit` device.
    X86_64,
}

impl Arch {
    /// The emulator's file name.
    pub fn binary_name(self) -> &'static str {
        match self {
            Arch::Aarch64 => "qemu-system-aarch64",
            Arch::X86_64 => "qemu-system-x86_64",
        }
    }

    /// The Debian package that provides it.
    pub fn package(self) -> &'static str {
        match self {
            Arch::Aarch64 => "qemu-system-arm",
            Arch::X86_64 => "qemu-system-x86",
        }
    }

    /// The Rust target the unikernel builds for.
    pub fn target(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64-unknown-none",
            Arch::X86_64 => "x86_64-unknown-none",
        }
    }
}

/// One NUMA node of a QEMU machine.
#[derive(Clone, Debug)]
pub struct NodeDesc {
    /// Memory in MiB; 0 for a memoryless node.
    pub mem_mib: u64,
    /// CPU indices; empty for a CPU-less node.
    pub cpus: Vec<u32>,
}

/// A NUMA layout for a QEMU machine.
#[derive(Clone, Debug)]
pub struct Layout {
    pub nodes: Vec<NodeDesc>,
    /// Row `i` holds the distances from node `i`.
    pub distances: Vec<Vec<u8>>,
}

fn node(mem_mib: u64, cpus: &[u32]) -> NodeDesc {
    NodeDesc {
        mem_mib,
        cpus: cpus.to_vec(),
    }
}

impl Layout {
    /// The seed's 4-node AMD machine: `[[10,12,32,32],[12,10,32,32],[32,32,10,12],[32,32,12,10]]`,
    /// one CPU and 1 GiB per node (4 GiB in all).
    pub fn amd_4node() -> Layout {
        Layout {
            nodes: (0..4).map(|i| node(1024, &[i])).collect(),
            distances: vec![
                vec![10, 12, 32, 32],
                vec![12, 10, 32, 32],
                vec![32, 32, 10, 12],
                vec![32, 32, 12, 10],
            ],
        }
    }

    /// Node 2 has memory but no CPU (a CXL expander), node 3 CPUs but no memory; node 1 and
    /// node 2 are equally far from node 0, so the CPU penalty decides between them.
    pub fn cpuless_memoryless() -> Layout {
        Layout {
            nodes: vec![
                node(512, &[0]),
                node(512, &[1]),
                node(512, &[]),
                node(0, &[2, 3]),
            ],
            distances: vec![
                vec![10, 20, 20, 30],
                vec![20, 10, 30, 20],
                vec![20, 30, 10, 30],
                vec![30, 20, 30, 10],
            ],
        }
    }

    pub fn cpus(&self) -> usize {
        self.nodes.iter().map(|n| n.cpus.len()).sum()
    }

    pub fn mem_mib(&self) -> u64 {
        self.nodes.iter().map(|n| n.mem_mib).sum()
    }

    /// `-M virt … -numa …` for this layout (without `-kernel`).
    pub fn qemu_args(&self) -> Vec<String> {
        self.machine_args(Arch::Aarch64)
    }

    /// The machine, CPUs, memory and `-numa` options of this layout for `arch` (without
    /// `-kernel`).
    pub fn machine_args(&self, arch: Arch) -> Vec<String> {
        let machine: &[&str] = match arch {
            Arch::Aarch64 => &["-M", "virt", "-cpu", "cortex-a57"],
            Arch::X86_64 => &["-M", "q35", "-device", "isa-debug-exit"],
        };
        let mut a: Vec<String> = machine.iter().map(|s| s.to_string()).collect();
        a.extend(["-accel", "tcg,thread=multi"].map(String::from));
        a.push("-smp".into());
        a.push(self.cpus().to_string());
        a.push("-m".into());
        a.push(format!("{}M", self.mem_mib()));
        for (i, n) in self.nodes.iter().enumerate() {
            let mut spec = format!("node,nodeid={i}");
            for c in &n.cpus {
                write!(spec, ",cpus={c}").unwrap();
            }
            if n.mem_mib > 0 {
                a.push("-object".into());
                a.push(format!("memory-backend-ram,id=m{i},size={}M", n.mem_mib));
                write!(spec, ",memdev=m{i}").unwrap();
            }
            a.push("-numa".into());
            a.push(spec);
        }
        for (i, row) in self.distances.iter().enumerate() {
            for (j, d) in row.iter().enumerate() {
                if i != j {
                    a.push("-numa".into());
                    a.push(format!("dist,src={i},dst={j},val={d}"));
                }
            }
        }
        a
    }

    /// The layout in the hosted CLI's TOML (`numaframe zonelists --topology FILE`).
    pub fn toml(&self) -> String {
        let rows: Vec<String> = self.distances.iter().map(|r| format!("{r:?}")).collect();
        let mut t = format!("distances = [{}]\n", rows.join(", "));
        for (i, n) in self.nodes.iter().enumerate() {
            let cpus: Vec<String> = n.cpus.iter().map(u32::to_string).collect();
            write!(
                t,
                "[[node]]\nid = {i}\ncpus = \"{}\"\nmemory = \"{}M\"\n",
                cpus.join(","),
                n.mem_mib
            )
            .unwrap();
        }
        t
    }
}

/// The emulator for `arch` from `PATH`; a test without it fails rather than passing silently.
pub fn qemu_binary(arch: Arch) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(arch.binary_name()))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{} is not on PATH: install the Debian package {} \
             (scripts/test.sh does so when it runs as root)",
            arch.binary_name(),
            arch.package()
        )
    })
}

/// What a QEMU run printed on its serial console (stdout) and how it ended.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `qemu-system-aarch64` with `args`, killing it after `timeout`.
pub fn run_qemu(args: &[String], timeout: Duration) -> Run {
    run_arch(Arch::Aarch64, args, timeout)
}

/// Runs the emulator of `arch` with `args`, killing it after `timeout`.
pub fn run_arch(arch: Arch, args: &[String], timeout: Duration) -> Run {
    run_arch_in(arch, args, timeout, &std::env::temp_dir())
}

/// Runs `qemu-system-aarch64` with `args` in the working directory `cwd`, killing it after
/// `timeout`.
pub fn run_qemu_in(args: &[String], timeout: Duration, cwd: &Path) -> Run {
    run_arch_in(Arch::Aarch64, args, timeout, cwd)
}

/// Runs the emulator of `arch` with `args` in the working directory `cwd`, killing it after
/// `timeout`.
pub fn run_arch_in(arch: Arch, args: &[String], timeout: Duration, cwd: &Path) -> Run {
    let mut child = Command::new(qemu_binary(arch))
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu starts");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for qemu") {
            break status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let stdout = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
            panic!("qemu did not finish within {timeout:?}; console so far:\n{stdout}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        status,
        stdout: String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned(),
    }
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}
