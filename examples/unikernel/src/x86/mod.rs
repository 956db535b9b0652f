//! The x86_64 platform: QEMU's PC machines booted through PVH, the COM1 console, ACPI's SRAT
//! and SLIT for the NUMA layout, and `isa-debug-exit` to stop.
//!
//! The boot information (`hvm_start_info`, version 1) gives the memory map, the command line
//! and the RSDP. The kernel boots numaframe over the RAM the map lists, node by node as the
//! SRAT says, minus the first MiB and its own image; then it replaces the boot map with page
//! tables built from numaframe frames ([`paging`]). The CPUs are the MADT's enabled processors,
//! each on the node the SRAT gives its APIC id; the boot CPU starts the others with
//! INIT-SIPI-SIPI through a trampoline below 1 MiB ([`smp`]), and all run the SMP workload.

mod acpi;
mod cpu;
mod entry;
mod io;
mod lapic;
mod paging;
mod smp;

use alloc::vec::Vec;
use core::arch::asm;
use core::mem::size_of;
use core::ptr::{self, NonNull};

use numaframe::{
    BootOptions, FrameClearer, Machine, MemoryRange, NodeId, NodeInfo, PAGE_SIZE, PhysMemory,
    PhysRange, Topology,
};

use crate::boot::{self, MAX_CPUS, MAX_NODES, MAX_RANGES, Options};
use crate::kernel::{self, fail, println};
use crate::pcp::Kicks;
use crate::smp::Smp;
use crate::srat::MemoryError;

/// `hvm_start_info.magic`.
const START_MAGIC: u32 = 0x336e_c578;
/// E820 type of usable RAM, and of the ACPI tables and ACPI NVS areas.
const E820_RAM: u32 = 1;
const E820_ACPI: u32 = 3;
const E820_NVS: u32 = 4;
/// Memory-map entries the kernel keeps.
const MAX_MEMMAP: usize = 64;
/// The most bytes of the command line the kernel reads.
const CMDLINE_BYTES: usize = 1024;
/// Bytes of an ACPI 2.0 RSDP.
const RSDP_BYTES: u64 = 36;

/// The boot information of the PVH boot protocol (`struct hvm_start_info`, version 1).
#[repr(C)]
#[derive(Clone, Copy)]
struct StartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}

/// One entry of its memory map (`struct hvm_memmap_table_entry`).
#[repr(C)]
#[derive(Clone, Copy)]
struct MemmapEntry {
    addr: u64,
    size: u64,
    kind: u32,
    reserved: u32,
}

/// Writes to COM1.
pub fn write_console(s: &str) {
    io::serial_write(s);
}

/// The machine CPU index of the running CPU (0 until the boot CPU knows its own).
pub fn cpu_index() -> usize {
    cpu::cpu_index()
}

/// Stops the machine through `isa-debug-exit`: QEMU exits 33 on success, 35 on failure.
pub fn halt(ok: bool) -> ! {
    io::debug_exit(if ok {
        io::EXIT_SUCCESS
    } else {
        io::EXIT_FAILURE
    });
    // No such device: stop here, and QEMU's timeout (or its user) ends the run.
    park()
}

/// Stops this CPU for good.
pub fn park() -> ! {
    loop {
        // SAFETY: with interrupts off, `hlt` only waits; it touches no memory.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

/// Gives every other CPU a stack; returns the SMP participants, the boot CPU first.
pub fn start_cpus(machine: &Machine<'_>, boot_cpu: usize) -> Vec<usize> {
    smp::start_cpus(machine, boot_cpu)
}

/// Starts the SMP run's other participants with INIT-SIPI-SIPI.
pub fn release_cpus(smp: &Smp<'_, '_>) {
    let (Some(t), Some(startup)) = (TABLES.get(), STARTUP.get()) else {
        fail!("smp: no tables to start the CPUs from")
    };
    smp::release_cpus(smp, startup, &t.apic_ids[..t.ncpus]);
}

/// Physical memory as the allocator reaches it: identity-mapped.
struct Identity;

// SAFETY: the boot map and the kernel's own tables identity-map all RAM below 64 GiB (`kmain`
// refuses RAM above), readable and writable. The allocator only maps ranges it was given: RAM
// outside this image and the first MiB, which nothing else touches.
unsafe impl PhysMemory for Identity {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let addr = usize::try_from(range.start().addr().get()).ok()?;
        NonNull::new(ptr::with_exposed_provenance_mut(addr))
    }
}

static MEMORY: Identity = Identity;

/// Clears frames for the allocator with `rep stosb` (fast-string stores). x86 caches are
/// coherent with devices and RAM is mapped write-back, so nothing needs flushing after.
struct Clearer;

impl FrameClearer for Clearer {
    fn clear(&self, range: PhysRange) {
        let (Ok(start), Ok(len)) = (
            usize::try_from(range.start().addr().get()),
            usize::try_from(range.bytes()),
        ) else {
            return;
        };
        let base: *mut u8 = ptr::with_exposed_provenance_mut(start);
        // SAFETY: identity-mapped RAM the allocator owns (see `Identity`), nobody's while it
        // clears it; `rep stosb` writes exactly `len` bytes from `base` upwards (the direction
        // flag is clear, as the ABI requires).
        unsafe {
            asm!(
                "rep stosb",
                inout("rdi") base => _,
                inout("rcx") len => _,
                in("al") 0u8,
                options(nostack, preserves_flags)
            )
        };
    }
}

static CLEARER: Clearer = Clearer;

/// The tables the machine borrows, kept for its lifetime.
struct Tables {
    distances: [u8; MAX_NODES * MAX_NODES],
    infos: [NodeInfo; MAX_NODES],
    usable: [MemoryRange; MAX_RANGES],
    cpus: [NodeId; MAX_CPUS],
    /// The APIC id of each CPU, in the order of `cpus`.
    apic_ids: [u32; MAX_CPUS],
    nodes: usize,
    nusable: usize,
    ncpus: usize,
}

static TABLES: spin::Once<Tables> = spin::Once::new();
static MACHINE: spin::Once<Machine<'static>> = spin::Once::new();

/// How a drain wakes a CPU that idles while it holds its claimed cache: the CPU spins on its
/// mark (no interrupts here), so the kick only marks it.
pub static KICKS: Kicks = Kicks::new(|| {}, core::hint::spin_loop);
/// The local APIC and the trampoline page, for starting the other CPUs.
static STARTUP: spin::Once<smp::Startup> = spin::Once::new();
/// The command line, copied out of the boot information.
static CMDLINE: spin::Once<([u8; CMDLINE_BYTES], usize)> = spin::Once::new();

unsafe extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// Reads a value of the boot information (physical memory, identity-mapped).
fn read_phys<T: Copy>(address: u64) -> T {
    // SAFETY: the PVH loader put the boot information, its memory map and command line at
    // these addresses in memory the boot map covers; reading them has no side effect.
    unsafe { ptr::with_exposed_provenance::<T>(address as usize).read_unaligned() }
}

/// The command line at `at` (NUL-terminated), copied; `""` if there is none or it is not
/// UTF-8.
fn cmdline(at: u64) -> &'static str {
    let (bytes, len) = CMDLINE.call_once(|| {
        let mut buf = [0u8; CMDLINE_BYTES];
        let mut len = 0;
        if at != 0 {
            while len < buf.len() {
                let b: u8 = read_phys(at + len as u64);
                if b == 0 {
                    break;
                }
                buf[len] = b;
                len += 1;
            }
        }
        (buf, len)
    });
    core::str::from_utf8(&bytes[..*len]).unwrap_or("")
}

pub(super) extern "C" fn kmain(start_info: u32) -> ! {
    io::serial_init();
    entry::install_exception_vectors();
    println(format_args!("numaframe-unikernel: booting (x86_64, PVH)"));
    let si: StartInfo = read_phys(u64::from(start_info));
    if si.magic != START_MAGIC || si.version < 1 {
        fail!(
            "no PVH start info version 1 at {start_info:#x} (magic {:#x}, version {})",
            si.magic,
            si.version
        )
    }
    let bootargs = cmdline(si.cmdline_paddr);
    let options = match Options::from_bootargs(bootargs) {
        Ok(o) => o,
        Err(e) => fail!("{e}"),
    };

    // The memory map: RAM to boot over, and RAM plus the ACPI areas for the page tables.
    let mut ram = [(0u64, 0u64); MAX_MEMMAP];
    let mut nram = 0;
    let mut mapped = [(0u64, 0u64); MAX_MEMMAP];
    let mut nmapped = 0;
    for i in 0..si.memmap_entries as usize {
        let e: MemmapEntry = read_phys(si.memmap_paddr + (i * size_of::<MemmapEntry>()) as u64);
        let end = e.addr.saturating_add(e.size);
        if matches!(e.kind, E820_RAM | E820_ACPI | E820_NVS) {
            if end > entry::BOOT_MAP_BYTES {
                fail!("memory above the 64 GiB boot map: {:#x}..{end:#x}", e.addr)
            }
            let Some(slot) = mapped.get_mut(nmapped) else {
                fail!("more than {MAX_MEMMAP} memory-map entries")
            };
            *slot = (e.addr, end);
            nmapped += 1;
        }
        if e.kind == E820_RAM {
            ram[nram] = (e.addr, e.size);
            nram += 1;
        }
    }
    let ram_mib: u64 = ram[..nram].iter().map(|r| r.1).sum::<u64>() >> 20;
    println(format_args!(
        "numaframe-unikernel: PVH start info at {start_info:#x}: {} memory-map entries, {ram_mib} MiB RAM, RSDP at {:#x}, bootargs \"{bootargs}\"",
        si.memmap_entries, si.rsdp_paddr
    ));

    let empty = MemoryRange {
        node: NodeId::new(0),
        range: PhysRange::default(),
    };
    let mut t = Tables {
        distances: [10; MAX_NODES * MAX_NODES],
        infos: [NodeInfo::default(); MAX_NODES],
        usable: [empty; MAX_RANGES],
        cpus: [NodeId::new(0); MAX_CPUS],
        apic_ids: [0; MAX_CPUS],
        nodes: 1,
        nusable: 0,
        ncpus: 1,
    };
    let mut found = [empty; MAX_RANGES];
    let firmware = match acpi::read(si.rsdp_paddr as usize) {
        Ok(f) => f,
        Err(e) => fail!("{e}"),
    };
    // The CPUs: the MADT's enabled processors (without a MADT, the boot CPU alone).
    let me = cpu::apic_id();
    let boot_only = [me];
    let apic_ids = firmware
        .processors
        .as_ref()
        .map_or(&boot_only[..], |p| p.apic_ids());
    let Some(boot_cpu) = apic_ids.iter().position(|id| *id == me) else {
        fail!("the boot CPU (APIC {me:#x}) is not in the MADT")
    };
    t.ncpus = apic_ids.len();
    t.apic_ids[..t.ncpus].copy_from_slice(apic_ids);
    cpu::set_cpu_index(boot_cpu);
    // Linux uses the SRAT only if it names memory, no memory of two nodes overlaps, and that
    // memory covers the RAM to within 1 MiB (`acpi_numa_init`, `numa_cleanup_meminfo`,
    // `numa_meminfo_cover_memory`); otherwise it boots as without one.
    let srat = firmware.numa.as_ref().and_then(|numa| {
        let n = match numa.layout.memory(&ram[..nram], &mut found) {
            Ok(n) => n,
            // `numa_cleanup_meminfo` fails on memory of two nodes that overlaps.
            Err(MemoryError::Overlap) => return None,
            Err(MemoryError::TooMany) => fail!("more than {MAX_RANGES} memory ranges"),
        };
        let covered: u64 = found[..n].iter().map(|r| r.range.frames()).sum();
        let total: u64 = ram[..nram]
            .iter()
            .map(|&(b, l)| (b.saturating_add(l) / PAGE_SIZE).saturating_sub(b.div_ceil(PAGE_SIZE)))
            .sum();
        let mib = (1 << 20) / PAGE_SIZE;
        if total.saturating_sub(covered) < mib {
            return Some((numa, n));
        }
        if covered > 0 {
            println(format_args!(
                "NUMA: nodes only cover {}MB of your {}MB e820 RAM. Not used.",
                covered / mib,
                total / mib
            ));
        }
        None
    });
    let nfound = match srat {
        Some((numa, n)) => {
            let l = &numa.layout;
            t.nodes = l.nodes();
            t.distances = numa.distances;
            // An APIC id named twice is on the node of its last entry, as Linux's
            // `set_apicid_to_node` overwrites the earlier one.
            let cpus = l.cpus();
            for (i, (apic, node)) in cpus.iter().enumerate() {
                if !cpus[i + 1..].iter().any(|(a, _)| a == apic) {
                    t.infos[node.index()].has_cpus = true;
                }
            }
            // Each CPU on the node of its last SRAT processor entry; one the SRAT does not
            // name stays on node 0.
            for (node, id) in t.cpus.iter_mut().zip(apic_ids) {
                if let Some((_, n)) = cpus.iter().rfind(|(apic, _)| apic == id) {
                    *node = *n;
                }
            }
            n
        }
        None => {
            // No SRAT: one node with all RAM and every CPU, as Linux's dummy NUMA setup.
            t.infos[0].has_cpus = true;
            for (slot, &(base, len)) in found.iter_mut().zip(&ram[..nram]) {
                *slot = MemoryRange {
                    node: NodeId::new(0),
                    range: boot::frames_covering(base, len),
                };
            }
            nram.min(MAX_RANGES)
        }
    };

    // The other CPUs start in a page of the first MiB that holds none of the boot information,
    // through the boot CPU's local APIC.
    let boot_info = [
        (u64::from(start_info), size_of::<StartInfo>() as u64),
        (
            si.memmap_paddr,
            u64::from(si.memmap_entries) * size_of::<MemmapEntry>() as u64,
        ),
        (si.cmdline_paddr, CMDLINE_BYTES as u64),
        (si.rsdp_paddr, RSDP_BYTES),
    ];
    let Some(trampoline) = smp::trampoline_page(&ram[..nram], &boot_info) else {
        fail!("smp: no page of RAM below 640 KiB for the trampoline")
    };
    let lapic = match lapic::LocalApic::current() {
        Ok(l) => l,
        Err(e) => fail!("smp: {e}"),
    };
    STARTUP.call_once(|| smp::Startup { lapic, trampoline });

    // Keep the first MiB (BIOS data, the boot information, the trampoline) and this image
    // (stack, .bss and the boot page tables included) out of the allocator.
    let image_start = (&raw const __image_start).addr() as u64;
    let image_end = (&raw const __image_end).addr() as u64;
    let reserved = [
        boot::frames_covering(0, 1 << 20),
        boot::frames_covering(image_start, image_end - image_start),
    ];
    let Some(nusable) = boot::carve(&found[..nfound], &reserved, &mut t.usable) else {
        fail!("more than {MAX_RANGES} usable memory ranges")
    };
    t.nusable = nusable;
    boot::sync_memory_states(&mut t.infos[..t.nodes], &t.usable[..nusable]);
    println(format_args!(
        "numaframe-unikernel: {} nodes, {nusable} memory ranges, {} CPUs (boot CPU {boot_cpu}, APIC {me:#x}); image {image_start:#x}..{image_end:#x}, trampoline {trampoline:#x}, local APIC {:#x}",
        t.nodes,
        t.ncpus,
        lapic.base()
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

    let node = t.cpus[boot_cpu];
    let mmio = [Some((lapic.base(), PAGE_SIZE)), acpi::hpet_registers()];
    match paging::build(machine, node, &mapped[..nmapped], &mmio) {
        Ok(r) => println(format_args!(
            "numaframe-unikernel: page tables: {} frames from numaframe map {} MiB, CR3 {:#x}; a 2 MiB probe mapping took {} table frames and gave them back",
            r.table_frames,
            r.mapped >> 20,
            r.cr3,
            r.probe_tables
        )),
        Err(e) => fail!("page tables: {e}"),
    }
    kernel::run(machine, &options, bootargs, &t.cpus[..t.ncpus], boot_cpu)
}
