//! The bare-metal part: entry, console, power, the device tree and the global allocator.
//!
//! Runs on the boot CPU at EL1 with the MMU off, so physical memory is identity-mapped: every
//! data access is to Device memory, which needs aligned accesses (the target's `+strict-align`
//! makes the compiler emit only those) and the FP/SIMD unit is enabled by hand (`CPACR_EL1`).
//! The other CPUs stay powered off, as QEMU leaves them until a PSCI `CPU_ON`.

use core::arch::{asm, global_asm};
use core::fmt::{self, Write};
use core::panic::PanicInfo;
use core::ptr;

use numaframe::fdt::{self as dt, FdtTopology};
use numaframe::heap::{DEFAULT_GROW_ORDER, IdentityMap, NumaHeap};
use numaframe::{
    BootOptions, Machine, MemoryRange, NodeId, NodeInfo, PAGE_SIZE, PhysMemory, PhysRange, Topology,
};

use crate::boot::{self, MAX_CPUS, MAX_NODES, MAX_RANGES, Options};

// The entry point. QEMU starts the ELF at `_start` on every CPU that is powered on (only CPU 0
// with PSCI). x0 may hold the device tree's address; QEMU's bare-ELF boot leaves it 0 and puts
// the tree at the base of RAM.
global_asm!(
    r#"
    .section .text.boot, "ax"
    .global _start
_start:
    mrs     x1, mpidr_el1
    and     x1, x1, #0xff
    cbnz    x1, 3f
    mov     x19, x0
    adrp    x1, vectors
    add     x1, x1, :lo12:vectors
    msr     vbar_el1, x1
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    isb
    adrp    x1, __stack_top
    add     x1, x1, :lo12:__stack_top
    mov     sp, x1
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
1:  cmp     x1, x2
    b.hs    2f
    str     xzr, [x1], #8
    b       1b
2:  mov     x0, x19
    bl      kmain
3:  wfe
    b       3b

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
"#
);

/// QEMU virt's PL011 UART.
const UART_BASE: usize = 0x0900_0000;
/// Where QEMU puts the device tree for a bare ELF: the base of RAM.
const DTB_DEFAULT: usize = 0x4000_0000;

/// The PL011 console (transmit only, no initialisation needed on QEMU).
struct Uart;

impl Uart {
    fn put(b: u8) {
        let fr = ptr::with_exposed_provenance::<u32>(UART_BASE + 0x18);
        let dr = ptr::with_exposed_provenance_mut::<u32>(UART_BASE);
        // SAFETY: 0x0900_0000 is the PL011 of QEMU virt, identity-mapped with the MMU off; FR
        // (offset 0x18) and DR (offset 0) are aligned 32-bit device registers.
        unsafe {
            while fr.read_volatile() & (1 << 5) != 0 {}
            dr.write_volatile(u32::from(b));
        }
    }
}

impl Write for Uart {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(Uart::put);
        Ok(())
    }
}

/// How PSCI calls reach the firmware (`/psci` `method`): QEMU itself answers `hvc` when the
/// guest runs at EL1 without EL2/EL3.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Conduit {
    Hvc,
    Smc,
}

const PSCI_SYSTEM_OFF: u64 = 0x8400_0008;
const PSCI_SYSTEM_RESET: u64 = 0x8400_0009;

fn psci(conduit: Conduit, function: u64) -> ! {
    // SAFETY: a PSCI call with no arguments; SYSTEM_OFF and SYSTEM_RESET do not return on
    // success, and the firmware preserves everything else per the SMC calling convention.
    unsafe {
        match conduit {
            Conduit::Hvc => asm!("hvc #0", in("x0") function, options(nomem, nostack)),
            Conduit::Smc => asm!("smc #0", in("x0") function, options(nomem, nostack)),
        }
    }
    loop {
        // SAFETY: waiting for an event has no effect on memory.
        unsafe { asm!("wfe", options(nomem, nostack)) };
    }
}

static CONDUIT: spin::Once<Conduit> = spin::Once::new();

fn conduit() -> Conduit {
    *CONDUIT.get().unwrap_or(&Conduit::Hvc)
}

/// Stops the machine: QEMU exits (with 0; the last line printed says whether the run passed).
fn halt(ok: bool) -> ! {
    // SYSTEM_RESET makes QEMU exit under `-no-reboot`, and otherwise reboots into a second,
    // visible run; SYSTEM_OFF always exits.
    psci(
        conduit(),
        if ok {
            PSCI_SYSTEM_OFF
        } else {
            PSCI_SYSTEM_RESET
        },
    )
}

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    let _ = writeln!(Uart, "numaframe-unikernel: panicked: {info}");
    halt(false)
}

#[unsafe(no_mangle)]
extern "C" fn exception(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    let _ = writeln!(
        Uart,
        "numaframe-unikernel: exception {kind}: ESR {esr:#x} ELR {elr:#x} FAR {far:#x}"
    );
    halt(false)
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
// SAFETY: the MMU is off: physical memory is identity-mapped and writable, and the frames the
// machine hands out are RAM it was given.
static FRAMES: IdentityMap = unsafe { IdentityMap::new() };

/// The device tree's tables, kept for the machine's lifetime.
struct Tables {
    distances: [u8; MAX_NODES * MAX_NODES],
    infos: [NodeInfo; MAX_NODES],
    found: [MemoryRange; MAX_RANGES],
    usable: [MemoryRange; MAX_RANGES],
    cpus: [NodeId; MAX_CPUS],
    nodes: usize,
    nusable: usize,
    ncpus: usize,
}

static TABLES: spin::Once<Tables> = spin::Once::new();
static MACHINE: spin::Once<Machine<'static>> = spin::Once::new();
static CPU_NODE: spin::Once<NodeId> = spin::Once::new();

#[global_allocator]
static HEAP: NumaHeap<'static, 'static, MAX_NODES> = NumaHeap::new();

/// The node of the running CPU: only the boot CPU runs.
fn current_node() -> NodeId {
    *CPU_NODE.get().unwrap_or(&NodeId::new(0))
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

macro_rules! fail {
    ($($arg:tt)*) => {{
        let _ = writeln!(Uart, "numaframe-unikernel: FAILED: {}", format_args!($($arg)*));
        halt(false)
    }};
}

#[unsafe(no_mangle)]
extern "C" fn kmain(x0: usize) -> ! {
    let out = &mut Uart;
    let _ = writeln!(out, "numaframe-unikernel: booting");
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
    let mut t = Tables {
        distances: [0; MAX_NODES * MAX_NODES],
        infos: [NodeInfo::default(); MAX_NODES],
        found: [MemoryRange {
            node: NodeId::new(0),
            range: PhysRange::default(),
        }; MAX_RANGES],
        usable: [MemoryRange {
            node: NodeId::new(0),
            range: PhysRange::default(),
        }; MAX_RANGES],
        cpus: [NodeId::new(0); MAX_CPUS],
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
    let bootargs = info.bootargs.unwrap_or("");
    let _ = writeln!(
        out,
        "numaframe-unikernel: device tree at {:#x} ({} bytes): {nodes} nodes, {nfound} memory ranges, {ncpus} CPUs, bootargs \"{bootargs}\"",
        dtb.as_ptr().addr(),
        dtb.len(),
    );
    let options = match Options::from_bootargs(bootargs) {
        Ok(o) => o,
        Err(e) => fail!("{e}"),
    };

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
            nres += 1;
        }
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
    let _ = writeln!(
        out,
        "numaframe-unikernel: image {image_start:#x}..{image_end:#x}, reserved {reserved_kib} KiB in {nres} ranges"
    );

    let t: &'static Tables = TABLES.call_once(|| t);
    let topology = match Topology::new(&t.distances[..t.nodes * t.nodes], &t.infos[..t.nodes]) {
        Ok(topo) => topo,
        Err(e) => fail!("topology: {e}"),
    };
    let cpu_node = t.cpus[..t.ncpus].first().copied().unwrap_or(NodeId::new(0));
    CPU_NODE.call_once(|| cpu_node);
    let opts = BootOptions {
        cpus: &t.cpus[..t.ncpus],
        fallback: options.fallback(),
        ..BootOptions::default()
    };
    let machine = match Machine::boot(topology, &MEMORY, &t.usable[..t.nusable], opts) {
        Ok(m) => MACHINE.call_once(|| m),
        Err(e) => fail!("boot: {e}"),
    };
    let managed: u64 = machine.nodes().iter().map(|n| n.managed_pages()).sum();
    let _ = writeln!(
        out,
        "numaframe-unikernel: numaframe manages {} MiB on {} nodes{}",
        (managed * PAGE_SIZE) >> 20,
        machine.memory_nodes().count(),
        if options.linux_boot_order {
            " (Linux boot order)"
        } else {
            ""
        }
    );
    #[cfg(feature = "defmt")]
    crate::log::booted(machine, &t.usable[..t.nusable]);

    // The contract: the kernel's fallback lines, one per node, ascending.
    if boot::print_zonelists(machine, out).is_err() {
        fail!("console")
    }

    if let Err(e) = HEAP.init(machine, &FRAMES, current_node, DEFAULT_GROW_ORDER) {
        fail!("heap: {e}")
    }
    let huge = match boot::reserve_hugepages(machine, bootargs, out) {
        Ok(r) => r,
        Err(e) => fail!("{e}"),
    };
    #[cfg(feature = "defmt")]
    crate::log::hugepages(machine);
    let frames = match boot::exercise_policies(machine, cpu_node, options.weights(), out) {
        Ok(f) => f,
        Err(e) => fail!("{e}"),
    };
    let heap_bytes = match boot::exercise_heap() {
        Ok(b) => b,
        Err(e) => fail!("{e}"),
    };
    for node in machine.topology().node_ids() {
        let s = HEAP.stats(node);
        if s.frames > 0 {
            let _ = writeln!(
                out,
                "heap: node {node}: {} chunks, {} frames, {} bytes in use",
                s.chunks, s.frames, s.used
            );
        }
    }
    let _ = writeln!(
        out,
        "numaframe-unikernel: ok: {} nodes, {} MiB managed, {} huge pages, {frames} frames under 6 policies, {} KiB through the heap; powering off",
        machine.topology().len(),
        (managed * PAGE_SIZE) >> 20,
        huge.allocated.iter().sum::<u64>(),
        heap_bytes >> 10,
    );
    #[cfg(feature = "defmt")]
    crate::log::done();
    halt(true)
}
