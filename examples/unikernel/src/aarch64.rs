//! The aarch64 platform: QEMU `virt`, its device tree, the PL011 UART and PSCI.
//!
//! Runs at EL1 with the MMU off, so physical memory is identity-mapped: every data access is to
//! Device-nGnRnE memory, which needs aligned accesses (the target's `+strict-align` makes the
//! compiler emit only those) and the FP/SIMD unit is enabled by hand (`CPACR_EL1`). Exclusive
//! loads and stores (`ldaxr`/`stlxr`, what atomics and spinlocks compile to on ARMv8.0) work on
//! that memory under QEMU's TCG: the SMP run's atomics check counts every increment of all
//! CPUs. (On hardware the architecture leaves exclusives on Device memory to the
//! implementation; a kernel for hardware would turn the MMU on with normal cacheable memory.)
//!
//! The boot CPU boots numaframe, then starts every other CPU of the device tree with PSCI
//! `CPU_ON`. Each gets a 128 KiB stack allocated from numaframe on its own node (so it stays
//! out of the free memory), its machine CPU index in `TPIDR_EL1` (the heap's current node
//! follows from it), and its slot in the SMP run as the PSCI context id.

use alloc::vec::Vec;
use core::arch::{asm, global_asm};
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};

use numaframe::fdt::{self as dt, FdtTopology};
use numaframe::{
    BootOptions, FrameClearer, Machine, MemoryRange, NodeId, NodeInfo, PAGE_SIZE, PhysMemory,
    PhysRange, Topology,
};

use crate::boot::{self, MAX_CPUS, MAX_NODES, MAX_RANGES, Options};
use crate::kernel::{self, fail, println};
use crate::pcp::Kicks;
use crate::smp::Smp;

/// A CPU's start record, read by `_secondary` before it has a stack.
#[repr(C)]
struct StartRecord {
    /// Top of the CPU's stack.
    stack_top: AtomicU64,
    /// The CPU's machine index, for `TPIDR_EL1`.
    cpu: AtomicU64,
}

/// Start records by SMP slot (slot 0, the boot CPU, is unused).
static START: [StartRecord; MAX_CPUS] = [const {
    StartRecord {
        stack_top: AtomicU64::new(0),
        cpu: AtomicU64::new(0),
    }
}; MAX_CPUS];

// The entry points. QEMU starts the ELF at `_start` on the boot CPU only (the others wait for
// PSCI `CPU_ON`, which enters them at `_secondary` with the context id in x0). x0 may hold the
// device tree's address; QEMU's bare-ELF boot leaves it 0 and puts the tree at the base of RAM.
global_asm!(
    r#"
    .section .text.boot, "ax"
    .global _start
_start:
    mov     x19, x0
    bl      2f
    adrp    x1, __stack_top
    add     x1, x1, :lo12:__stack_top
    mov     sp, x1
    msr     tpidr_el1, xzr
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
1:  cmp     x1, x2
    b.hs    3f
    str     xzr, [x1], #8
    b       1b
3:  mov     x0, x19
    bl      kmain
4:  wfe
    b       4b

    // Exception vectors and FP/SIMD, for every CPU.
2:  adrp    x1, vectors
    add     x1, x1, :lo12:vectors
    msr     vbar_el1, x1
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    isb
    ret

    .global _secondary
_secondary:
    mov     x19, x0
    bl      2b
    adrp    x1, {start}
    add     x1, x1, :lo12:{start}
    add     x1, x1, x19, lsl #4
    ldr     x2, [x1]
    ldr     x3, [x1, #8]
    mov     sp, x2
    msr     tpidr_el1, x3
    mov     x0, x19
    bl      {secondary}
    b       4b

    .macro vector id
    .balign 128
    mov     x0, #\id
    mrs     x1, esr_el1
    mrs     x2, elr_el1
    mrs     x3, far_el1
    b       exception
    .endm

    .section .text.vectors, "ax"
    .balign 2048
vectors:
    vector 0
    vector 1
    vector 2
    vector 3
    vector 4
    vector 5
    vector 6
    vector 7
    vector 8
    vector 9
    vector 10
    vector 11
    vector 12
    vector 13
    vector 14
    vector 15
"#,
    start = sym START,
    secondary = sym secondary_entry,
);

/// QEMU virt's PL011 UART.
const UART_BASE: usize = 0x0900_0000;
/// Where QEMU puts the device tree for a bare ELF: the base of RAM.
const DTB_DEFAULT: usize = 0x4000_0000;

/// Writes to the PL011 (transmit only, no initialisation needed on QEMU).
pub fn write_console(s: &str) {
    let fr = ptr::with_exposed_provenance::<u32>(UART_BASE + 0x18);
    let dr = ptr::with_exposed_provenance_mut::<u32>(UART_BASE);
    for b in s.bytes() {
        // SAFETY: 0x0900_0000 is the PL011 of QEMU virt, identity-mapped with the MMU off; FR
        // (offset 0x18) and DR (offset 0) are aligned 32-bit device registers.
        unsafe {
            while fr.read_volatile() & (1 << 5) != 0 {}
            dr.write_volatile(u32::from(b));
        }
    }
}

/// The machine CPU index of the running CPU, from `TPIDR_EL1`.
pub fn cpu_index() -> usize {
    let v: u64;
    // SAFETY: reading a system register this kernel owns has no side effect.
    unsafe { asm!("mrs {}, tpidr_el1", out(reg) v, options(nomem, nostack)) };
    v as usize
}

/// How PSCI calls reach the firmware (`/psci` `method`): QEMU itself answers `hvc` when the
/// guest runs at EL1 without EL2/EL3.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Conduit {
    Hvc,
    Smc,
}

const PSCI_CPU_ON: u64 = 0xc400_0003;
const PSCI_SYSTEM_OFF: u64 = 0x8400_0008;
const PSCI_SYSTEM_RESET: u64 = 0x8400_0009;

static CONDUIT: spin::Once<Conduit> = spin::Once::new();

/// A PSCI call with up to three arguments; returns x0.
fn psci(function: u64, a: u64, b: u64, c: u64) -> i64 {
    let ret: i64;
    // SAFETY: a PSCI call per the SMC calling convention: the firmware reads x0..x3, returns in
    // x0 and may change x1..x17 (the clobbered C ABI registers); memory is not touched, except
    // that CPU_ON starts a CPU, which reads the start records published before the call.
    unsafe {
        match *CONDUIT.get().unwrap_or(&Conduit::Hvc) {
            Conduit::Hvc => asm!(
                "dsb sy", "hvc #0",
                inlateout("x0") function => ret, in("x1") a, in("x2") b, in("x3") c,
                clobber_abi("C"), options(nostack),
            ),
            Conduit::Smc => asm!(
                "dsb sy", "smc #0",
                inlateout("x0") function => ret, in("x1") a, in("x2") b, in("x3") c,
                clobber_abi("C"), options(nostack),
            ),
        }
    }
    ret
}

/// Stops the machine: QEMU exits (with 0; the last line printed says whether the run passed).
pub fn halt(ok: bool) -> ! {
    // SYSTEM_RESET makes QEMU exit under `-no-reboot`, and otherwise reboots into a second,
    // visible run; SYSTEM_OFF always exits. Both stop every CPU.
    psci(
        if ok {
            PSCI_SYSTEM_OFF
        } else {
            PSCI_SYSTEM_RESET
        },
        0,
        0,
        0,
    );
    park()
}

/// Waits for the machine to stop.
pub fn park() -> ! {
    loop {
        // SAFETY: waiting for an event has no effect on memory.
        unsafe { asm!("wfe", options(nomem, nostack)) };
    }
}

#[unsafe(no_mangle)]
extern "C" fn exception(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    fail!(
        "cpu{}: exception {kind}: ESR {esr:#x} ELR {elr:#x} FAR {far:#x}",
        cpu_index()
    )
}

extern "C" fn secondary_entry(slot: usize) -> ! {
    kernel::secondary(slot)
}

/// Physical memory as the allocator reaches it: identity-mapped.
struct Identity;

// SAFETY: with the MMU off every physical address is its own address, readable and writable,
// page aligned for page-aligned ranges. The allocator only maps ranges it was given, and it was
// given only RAM outside this image and the device tree, which nothing else touches.
unsafe impl PhysMemory for Identity {
    fn map(&self, range: PhysRange) -> Option<ptr::NonNull<u8>> {
        let addr = usize::try_from(range.start().addr().get()).ok()?;
        ptr::NonNull::new(ptr::with_exposed_provenance_mut(addr))
    }
}

static MEMORY: Identity = Identity;

/// Clears frames for the allocator. With the MMU (and so the data cache) on, `DC ZVA` zeroes a
/// block at a time and `DC CVAC` cleans the lines to the point of coherency, so that a reader
/// with its caches off (a guest, a device) sees the zeros; with the MMU off memory is Device
/// memory, where `DC ZVA` faults: plain aligned stores reach memory directly.
struct Clearer;

/// Bytes `DC ZVA` zeroes, if the CPU allows it (`DCZID_EL0`: bit 4 prohibits it, bits 0..4
/// are log2 of the block in words).
fn zva_block() -> Option<usize> {
    let v: u64;
    // SAFETY: reading an ID register has no side effect.
    unsafe { asm!("mrs {}, dczid_el0", out(reg) v, options(nomem, nostack, preserves_flags)) };
    (v & (1 << 4) == 0).then(|| 4usize << (v & 0xf))
}

/// The smallest data cache line in bytes (`CTR_EL0.DminLine`, log2 of words).
fn dcache_line() -> usize {
    let v: u64;
    // SAFETY: reading an ID register has no side effect.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) v, options(nomem, nostack, preserves_flags)) };
    4usize << ((v >> 16) & 0xf)
}

fn mmu_on() -> bool {
    let v: u64;
    // SAFETY: reading the system control register has no side effect.
    unsafe { asm!("mrs {}, sctlr_el1", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v & 1 != 0
}

impl FrameClearer for Clearer {
    fn clear(&self, range: PhysRange) {
        let (Ok(start), Ok(len)) = (
            usize::try_from(range.start().addr().get()),
            usize::try_from(range.bytes()),
        ) else {
            return;
        };
        let base: *mut u8 = ptr::with_exposed_provenance_mut(start);
        match zva_block().filter(|b| mmu_on() && b.is_power_of_two() && *b <= PAGE_SIZE as usize) {
            Some(block) => {
                let line = dcache_line();
                for off in (0..len).step_by(block) {
                    // SAFETY: identity-mapped RAM the allocator owns (see `Identity`), nobody's
                    // while it clears it; `off` is block aligned (ranges are whole pages).
                    unsafe {
                        asm!("dc zva, {}", in(reg) base.add(off), options(nostack, preserves_flags))
                    };
                }
                for off in (0..len).step_by(line) {
                    // SAFETY: as above; cleaning a line to the point of coherency only writes
                    // it back.
                    unsafe {
                        asm!("dc cvac, {}", in(reg) base.add(off), options(nostack, preserves_flags))
                    };
                }
            }
            None => {
                let words = base.cast::<u64>();
                for i in 0..len / 8 {
                    // SAFETY: as above; the range is page aligned, so every word is aligned, as
                    // Device memory needs.
                    unsafe { words.add(i).write_volatile(0) };
                }
            }
        }
        // SAFETY: a barrier: the zeros (and the cleans) complete before the frames are handed
        // out.
        unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
    }
}

static CLEARER: Clearer = Clearer;

/// The device tree's tables, kept for the machine's lifetime.
struct Tables {
    distances: [u8; MAX_NODES * MAX_NODES],
    infos: [NodeInfo; MAX_NODES],
    found: [MemoryRange; MAX_RANGES],
    usable: [MemoryRange; MAX_RANGES],
    cpus: [NodeId; MAX_CPUS],
    /// The `reg` (MPIDR affinity) of each CPU, in the order of `cpus`.
    mpidrs: [u64; MAX_CPUS],
    nodes: usize,
    nusable: usize,
    ncpus: usize,
}

static TABLES: spin::Once<Tables> = spin::Once::new();
static MACHINE: spin::Once<Machine<'static>> = spin::Once::new();

/// How a drain wakes a CPU that idles while it holds its claimed cache: a `sev`, which ends
/// the `wfe` it waits in.
pub static KICKS: Kicks = Kicks::new(send_event, wait_event);

/// Wakes every CPU waiting for an event.
fn send_event() {
    // SAFETY: signalling an event has no effect on memory. `dsb` first: the kick's store is
    // visible to a CPU that the event wakes.
    unsafe { asm!("dsb ish", "sev", options(nostack)) };
}

/// Waits for an event (a `sev` since the last wait ends it at once).
fn wait_event() {
    // SAFETY: waiting for an event has no effect on memory.
    unsafe { asm!("wfe", options(nomem, nostack)) };
}

unsafe extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// The device tree QEMU passed: at `x0` if that holds one, else at the base of RAM.
fn device_tree(x0: usize) -> Option<&'static [u8]> {
    for at in [x0, DTB_DEFAULT] {
        if at == 0 || at % 8 != 0 {
            continue;
        }
        let header = ptr::with_exposed_provenance::<[u8; 8]>(at);
        // SAFETY: `at` is 0x4000_0000 (RAM) or what QEMU put in x0 (the tree), identity-mapped
        // and 8-byte aligned; reading 8 bytes of RAM has no side effect.
        let h = unsafe { header.read_volatile() };
        if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) != 0xd00d_feed {
            continue;
        }
        let size = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        // SAFETY: QEMU wrote a tree of `size` bytes at `at` (its header says so); that memory is
        // reserved below (never given to the allocator) and nothing writes it, so it stays
        // valid and unchanged for the program's life.
        return Some(unsafe {
            core::slice::from_raw_parts(ptr::with_exposed_provenance::<u8>(at), size)
        });
    }
    None
}

/// Writes the `reg` of every CPU node into `out`, in the order `numaframe::fdt::parse` lists
/// CPUs (children of `/cpus` named `cpu` or with `device_type = "cpu"`, less those whose
/// `status` is `"fail"` or `"fail-…"`, as Linux's `for_each_of_cpu_node`); returns how many.
/// The core's parser gives each CPU's node but not its `reg`, which PSCI `CPU_ON` needs.
fn cpu_ids(dtb: &[u8], out: &mut [u64]) -> Result<usize, fdt::FdtError> {
    use fdt::nodes::AsNode;
    let tree = fdt::Fdt::new_unaligned_fallible(dtb)?;
    // `/cpus` as Linux's `of_find_node_by_path` finds it (and `numaframe::fdt::parse` with it):
    // the first child of the root named exactly `cpus`.
    let mut found = None;
    for child in tree.root()?.as_node().children()?.iter() {
        let child = child?;
        let name = child.name()?;
        if name.name == "cpus" && name.unit_address.is_none() {
            found = Some(child);
            break;
        }
    }
    let Some(cpus) = found else {
        return Ok(0);
    };
    let mut n = 0;
    for child in cpus.children()?.iter() {
        let child = child?;
        let name = child.name()?.name;
        let props = child.properties()?;
        let value = |name| -> Result<Option<&[u8]>, fdt::FdtError> {
            Ok(props.find(name)?.map(|p| p.value))
        };
        let is_cpu = name == "cpu" || value("device_type")? == Some(b"cpu\0".as_slice());
        let failed = value("status")?.is_some_and(|s| {
            let s = s.split(|b| *b == 0).next().unwrap_or_default();
            s == b"fail" || s.starts_with(b"fail-")
        });
        if !is_cpu || failed {
            continue;
        }
        let reg = value("reg")?.unwrap_or_default();
        let id = reg
            .iter()
            .rev()
            .take(8)
            .rev()
            .fold(0u64, |v, b| (v << 8) | u64::from(*b));
        if let Some(slot) = out.get_mut(n) {
            *slot = id;
        }
        n += 1;
    }
    Ok(n)
}

/// The MPIDR affinity fields (Aff3..Aff0) of the running CPU, as the device tree's `reg`.
fn mpidr() -> u64 {
    let v: u64;
    // SAFETY: reading MPIDR_EL1 has no side effect.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) v, options(nomem, nostack)) };
    v & 0xff_00ff_ffff
}

#[unsafe(no_mangle)]
extern "C" fn kmain(x0: usize) -> ! {
    println(format_args!("numaframe-unikernel: booting"));
    let Some(dtb) = device_tree(x0) else {
        fail!("no device tree at x0 ({x0:#x}) or at {DTB_DEFAULT:#x}")
    };
    if let Ok(Some(method)) = dt::string_property(dtb, "/psci", "method") {
        CONDUIT.call_once(|| {
            if method == "smc" {
                Conduit::Smc
            } else {
                Conduit::Hvc
            }
        });
    }
    #[cfg(feature = "defmt")]
    crate::log::init();

    // The topology, into tables on the stack, then kept for good.
    let empty = MemoryRange {
        node: NodeId::new(0),
        range: PhysRange::default(),
    };
    let mut t = Tables {
        distances: [0; MAX_NODES * MAX_NODES],
        infos: [NodeInfo::default(); MAX_NODES],
        found: [empty; MAX_RANGES],
        usable: [empty; MAX_RANGES],
        cpus: [NodeId::new(0); MAX_CPUS],
        mpidrs: [0; MAX_CPUS],
        nodes: 0,
        nusable: 0,
        ncpus: 0,
    };
    let mut ft = FdtTopology::new(&mut t.distances, &mut t.infos, &mut t.found, &mut t.cpus);
    let info = match dt::parse(dtb, &mut ft) {
        Ok(info) => info,
        Err(e) => fail!("device tree: {e}"),
    };
    let (nodes, nfound, ncpus) = (ft.nodes(), ft.ranges().len(), ft.cpus().len());
    match cpu_ids(dtb, &mut t.mpidrs) {
        Ok(n) if n == ncpus => {}
        Ok(n) => fail!("device tree: {n} CPU ids for {ncpus} CPUs"),
        Err(e) => fail!("device tree CPU ids: {e:?}"),
    }
    let bootargs = info.bootargs.unwrap_or("");
    println(format_args!(
        "numaframe-unikernel: device tree at {:#x} ({} bytes): {nodes} nodes, {nfound} memory ranges, {ncpus} CPUs, bootargs \"{bootargs}\"",
        dtb.as_ptr().addr(),
        dtb.len(),
    ));
    let options = match Options::from_bootargs(bootargs) {
        Ok(o) => o,
        Err(e) => fail!("{e}"),
    };
    let me = mpidr();
    let Some(boot_cpu) = t.mpidrs[..ncpus].iter().position(|m| *m == me) else {
        fail!("the boot CPU (MPIDR {me:#x}) is not in the device tree")
    };
    // SAFETY: writing the software thread ID register only changes what `cpu_index` reads.
    unsafe { asm!("msr tpidr_el1, {}", in(reg) boot_cpu as u64, options(nomem, nostack)) };

    // Keep the device tree, this image (stack and .bss included) and the tree's own
    // reservations out of the allocator.
    let image_start = (&raw const __image_start).addr() as u64;
    let image_end = (&raw const __image_end).addr() as u64;
    let mut reserved = [PhysRange::default(); 16];
    reserved[0] = boot::frames_covering(dtb.as_ptr().addr() as u64, dtb.len() as u64);
    reserved[1] = boot::frames_covering(image_start, image_end - image_start);
    let mut nres = 2;
    let walk = dt::for_each_reservation(dtb, |base, size| {
        if let Some(slot) = reserved.get_mut(nres) {
            *slot = boot::frames_covering(base.get(), size);
        }
        nres += 1;
    });
    if let Err(e) = walk {
        fail!("device tree reservations: {e}")
    }
    if nres > reserved.len() {
        fail!("more than {} memory reservations", reserved.len() - 2)
    }
    let Some(nusable) = boot::carve(&t.found[..nfound], &reserved[..nres], &mut t.usable) else {
        fail!("more than {MAX_RANGES} usable memory ranges")
    };
    t.nodes = nodes;
    t.ncpus = ncpus;
    t.nusable = nusable;
    boot::sync_memory_states(&mut t.infos[..nodes], &t.usable[..nusable]);
    let reserved_kib: u64 = reserved[..nres].iter().map(|r| r.bytes() >> 10).sum();
    println(format_args!(
        "numaframe-unikernel: image {image_start:#x}..{image_end:#x}, reserved {reserved_kib} KiB in {nres} ranges"
    ));

    let t: &'static Tables = TABLES.call_once(|| t);
    let topology = match Topology::new(&t.distances[..t.nodes * t.nodes], &t.infos[..t.nodes]) {
        Ok(topo) => topo,
        Err(e) => fail!("topology: {e}"),
    };
    let opts = BootOptions {
        cpus: &t.cpus[..t.ncpus],
        fallback: options.fallback(),
        ..BootOptions::default()
    };
    let machine = match Machine::boot(topology, &MEMORY, &t.usable[..t.nusable], opts) {
        Ok(m) => MACHINE.call_once(|| m.with_clearer(&CLEARER).with_kick(&KICKS)),
        Err(e) => fail!("boot: {e}"),
    };
    #[cfg(feature = "defmt")]
    crate::log::booted(machine, &t.usable[..t.nusable]);
    kernel::run(machine, &options, bootargs, &t.cpus[..t.ncpus], boot_cpu)
}

/// Gives every CPU but the boot CPU a stack from its own node and a start record; returns the
/// SMP participants, the boot CPU first.
pub fn start_cpus(machine: &Machine<'_>, boot_cpu: usize) -> Vec<usize> {
    kernel::give_stacks(machine, boot_cpu, |slot, index, top| {
        let record = &START[slot];
        // Relaxed: the `dsb` before PSCI CPU_ON orders these before the CPU starts.
        record.stack_top.store(top, Ordering::Relaxed);
        record.cpu.store(index as u64, Ordering::Relaxed);
    })
}

/// Starts the SMP run's other participants with PSCI `CPU_ON` at `_secondary`.
pub fn release_cpus(smp: &Smp<'_, '_>) {
    unsafe extern "C" {
        fn _secondary();
    }
    let entry = (_secondary as *const ()).addr() as u64;
    let Some(t) = TABLES.get() else {
        fail!("no device tree tables")
    };
    for slot in 1..smp.len() {
        let Some(index) = smp.cpu_of(slot) else {
            continue;
        };
        let target = t.mpidrs[index];
        let ret = psci(PSCI_CPU_ON, target, entry, slot as u64);
        if ret != 0 {
            fail!("PSCI CPU_ON of cpu{index} (MPIDR {target:#x}) returned {ret}")
        }
    }
}
