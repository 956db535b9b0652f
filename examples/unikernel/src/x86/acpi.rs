//! ACPI through rust-osdev's `acpi` crate, without its `alloc` feature: the handler the crate
//! needs, the NUMA layout from SRAT and SLIT, read under Linux's rules ([`crate::srat`]), and the
//! processors from the MADT.
//!
//! The crate finds and maps the tables from the RSDP. Its SRAT and SLIT accessors are wrong in
//! this version (and on its main branch), so the kernel reads those tables' bodies itself: the
//! SRAT's subtables through [`crate::srat::entries`] (the crate's iterator reads each
//! subtable's one-byte length as two bytes), and the SLIT's matrix (`Slit::matrix_raw` squares
//! the entry count twice in its size check and returns an empty matrix for every table of more
//! than one domain). The crate's processor list (`platform::ProcessorInfo`) needs its `alloc`
//! feature, which needs nightly (`allocator_api`), so the processors come from the crate's MADT
//! entry iterator instead.

use core::mem::size_of;
use core::ptr::{self, NonNull};

use acpi::sdt::madt::{Madt, MadtEntry};
use acpi::sdt::slit::Slit;
use acpi::sdt::srat::Srat;
use acpi::{AcpiTables, HpetInfo, PciAddress, RawPhysicalMapping};

use super::io;
use crate::boot::{MAX_CPUS, MAX_NODES};
use crate::kernel::{Console, fail};
use crate::srat::{self, Layout, SratError};

/// The `acpi` crate's view of the platform: memory identity-mapped (the boot map and the
/// kernel's own page tables both map the firmware's tables and the HPET), port I/O, PCI
/// configuration mechanism #1, and the HPET as its clock.
#[derive(Clone, Copy, Debug)]
pub struct Handler;

/// The HPET: its registers and its period.
struct Hpet {
    base: usize,
    femtos_per_tick: u64,
}

static HPET: spin::Once<Hpet> = spin::Once::new();

fn read_mmio<T: Copy>(address: usize) -> T {
    // SAFETY: the `acpi` crate reads only firmware tables and registers the ACPI tables name,
    // all identity-mapped here; volatile because registers may change under us.
    unsafe { ptr::with_exposed_provenance::<T>(address).read_volatile() }
}

fn write_mmio<T: Copy>(address: usize, value: T) {
    // SAFETY: as in `read_mmio`, for the registers the tables name.
    unsafe { ptr::with_exposed_provenance_mut::<T>(address).write_volatile(value) }
}

/// Starts the HPET the tables describe as the handler's clock.
fn start_hpet(tables: &AcpiTables<Handler>) {
    let Ok(info) = HpetInfo::new(tables) else {
        return;
    };
    let caps: u64 = read_mmio(info.base_address);
    let config: u64 = read_mmio(info.base_address + 0x10);
    write_mmio(info.base_address + 0x10, config | 1);
    HPET.call_once(|| Hpet {
        base: info.base_address,
        femtos_per_tick: caps >> 32,
    });
}

/// The address range the HPET's registers take, once it runs.
pub fn hpet_registers() -> Option<(u64, u64)> {
    HPET.get().map(|h| (h.base as u64, 1024))
}

/// Nanoseconds on the HPET's main counter, if the machine has an HPET.
pub fn hpet_nanos() -> Option<u64> {
    let h = HPET.get()?;
    let ticks: u64 = read_mmio(h.base + 0xf0);
    Some((u128::from(ticks) * u128::from(h.femtos_per_tick) / 1_000_000) as u64)
}

impl acpi::Handler for Handler {
    unsafe fn map_physical_region<T>(&self, address: usize, size: usize) -> RawPhysicalMapping<T> {
        let Some(start) = NonNull::new(ptr::with_exposed_provenance_mut::<T>(address)) else {
            fail!("ACPI: a table at address 0")
        };
        // SAFETY: physical memory is identity-mapped: the `size` bytes at `address` are mapped
        // at `address`, and stay so for the kernel's life.
        unsafe { RawPhysicalMapping::new(address, start, size, size) }
    }

    unsafe fn unmap_physical_region<T>(&self, _region: RawPhysicalMapping<T>) {}

    fn read_u8(&self, address: usize) -> u8 {
        read_mmio(address)
    }
    fn read_u16(&self, address: usize) -> u16 {
        read_mmio(address)
    }
    fn read_u32(&self, address: usize) -> u32 {
        read_mmio(address)
    }
    fn read_u64(&self, address: usize) -> u64 {
        read_mmio(address)
    }
    fn write_u8(&self, address: usize, value: u8) {
        write_mmio(address, value)
    }
    fn write_u16(&self, address: usize, value: u16) {
        write_mmio(address, value)
    }
    fn write_u32(&self, address: usize, value: u32) {
        write_mmio(address, value)
    }
    fn write_u64(&self, address: usize, value: u64) {
        write_mmio(address, value)
    }

    fn read_io_u8(&self, port: u16) -> u8 {
        io::inb(port)
    }
    fn read_io_u16(&self, port: u16) -> u16 {
        io::inw(port)
    }
    fn read_io_u32(&self, port: u16) -> u32 {
        io::inl(port)
    }
    fn write_io_u8(&self, port: u16, value: u8) {
        io::outb(port, value)
    }
    fn write_io_u16(&self, port: u16, value: u16) {
        io::outw(port, value)
    }
    fn write_io_u32(&self, port: u16, value: u32) {
        io::outl(port, value)
    }

    fn read_pci_u8(&self, address: PciAddress, offset: u16) -> u8 {
        (self.read_pci_u32(address, offset) >> ((offset & 3) * 8)) as u8
    }
    fn read_pci_u16(&self, address: PciAddress, offset: u16) -> u16 {
        (self.read_pci_u32(address, offset) >> ((offset & 2) * 8)) as u16
    }
    fn read_pci_u32(&self, address: PciAddress, offset: u16) -> u32 {
        if address.segment() != 0 {
            // Only segment 0 is reachable through the ports: read as an absent function does.
            return u32::MAX;
        }
        io::pci_read(address.bus(), address.device(), address.function(), offset)
    }
    fn write_pci_u8(&self, address: PciAddress, offset: u16, value: u8) {
        let shift = (offset & 3) * 8;
        let old = self.read_pci_u32(address, offset) & !(0xff << shift);
        self.write_pci_u32(address, offset, old | (u32::from(value) << shift));
    }
    fn write_pci_u16(&self, address: PciAddress, offset: u16, value: u16) {
        let shift = (offset & 2) * 8;
        let old = self.read_pci_u32(address, offset) & !(0xffff << shift);
        self.write_pci_u32(address, offset, old | (u32::from(value) << shift));
    }
    fn write_pci_u32(&self, address: PciAddress, offset: u16, value: u32) {
        if address.segment() == 0 {
            io::pci_write(
                address.bus(),
                address.device(),
                address.function(),
                offset,
                value,
            );
        }
    }

    fn nanos_since_boot(&self) -> u64 {
        let Some(now) = hpet_nanos() else {
            fail!("ACPI asked for the time, and the machine has no HPET")
        };
        now
    }

    fn stall(&self, microseconds: u64) {
        let until = self.nanos_since_boot().saturating_add(microseconds * 1_000);
        while self.nanos_since_boot() < until {
            core::hint::spin_loop();
        }
    }

    fn sleep(&self, milliseconds: u64) {
        self.stall(milliseconds.saturating_mul(1_000));
    }
}

/// The NUMA layout from SRAT and SLIT, numbered as Linux numbers it.
pub struct Numa {
    /// Nodes, processors and memory ranges.
    pub layout: Layout,
    /// `distances[a * nodes + b]`.
    pub distances: [u8; MAX_NODES * MAX_NODES],
}

/// The enabled processors of the MADT by local APIC id, in table order.
pub struct Processors {
    ids: [u32; MAX_CPUS],
    len: usize,
}

impl Processors {
    /// The APIC ids, in table order.
    pub fn apic_ids(&self) -> &[u32] {
        &self.ids[..self.len]
    }
}

/// What the kernel takes from ACPI.
pub struct Firmware {
    /// The NUMA layout; `None` without an SRAT.
    pub numa: Option<Numa>,
    /// The processors; `None` without a MADT.
    pub processors: Option<Processors>,
}

/// What went wrong reading ACPI.
#[derive(Debug)]
pub enum AcpiFailure {
    /// The crate refused the RSDP or the root table.
    Tables(acpi::AcpiError),
    /// The SRAT does not fit.
    Srat(SratError),
    /// The MADT lists more enabled processors than [`MAX_CPUS`].
    TooManyCpus,
}

impl core::fmt::Display for AcpiFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AcpiFailure::Tables(e) => write!(f, "ACPI tables: {e:?}"),
            AcpiFailure::Srat(e) => write!(f, "{e}"),
            AcpiFailure::TooManyCpus => write!(f, "MADT: more than {MAX_CPUS} processors"),
        }
    }
}

/// Reads the tables from the RSDP at `rsdp`, starts the HPET, and returns the NUMA layout and
/// the processors. Prints Linux's SRAT and SLIT lines.
///
/// # Errors
/// An [`AcpiFailure`] for tables the crate or this kernel cannot take.
pub fn read(rsdp: usize) -> Result<Firmware, AcpiFailure> {
    // SAFETY: `rsdp` is the RSDP's address as the boot information gives it; the crate checks
    // its signature before it follows any pointer in it.
    let tables = unsafe { AcpiTables::from_rsdp(Handler, rsdp) }.map_err(AcpiFailure::Tables)?;
    start_hpet(&tables);
    Ok(Firmware {
        numa: read_numa(&tables)?,
        processors: read_processors(&tables)?,
    })
}

/// The enabled processors of the MADT's local APIC and local x2APIC entries, each APIC id
/// once, in table order (the order Linux numbers CPUs in); `None` without a MADT.
fn read_processors(tables: &AcpiTables<Handler>) -> Result<Option<Processors>, AcpiFailure> {
    let Some(madt) = tables.find_table::<Madt>() else {
        return Ok(None);
    };
    let mut p = Processors {
        ids: [0; MAX_CPUS],
        len: 0,
    };
    for entry in madt.get().entries() {
        let (id, x2apic, flags) = match entry {
            MadtEntry::LocalApic(e) => (u32::from(e.apic_id), false, e.flags),
            MadtEntry::LocalX2Apic(e) => (e.x2apic_id, true, e.flags),
            _ => continue,
        };
        if !srat::madt_starts(id, x2apic, flags) || p.apic_ids().contains(&id) {
            continue;
        }
        let slot = p.ids.get_mut(p.len).ok_or(AcpiFailure::TooManyCpus)?;
        *slot = id;
        p.len += 1;
    }
    Ok(Some(p))
}

/// The NUMA layout from SRAT and SLIT, or `None` when there is no SRAT or Linux would not use
/// it (a machine without NUMA).
fn read_numa(tables: &AcpiTables<Handler>) -> Result<Option<Numa>, AcpiFailure> {
    let Some(srat) = tables.find_table::<Srat>() else {
        return Ok(None);
    };
    let header = srat.get().header;
    // SAFETY: the crate mapped the whole table, `header.length` bytes from its start.
    let table =
        unsafe { core::slice::from_raw_parts(srat.as_ptr().cast::<u8>(), header.length as usize) };
    let layout = match Layout::from_srat(header.revision, || srat::entries(table), &mut Console) {
        Ok(layout) => layout,
        // Linux boots as without an SRAT.
        Err(SratError::NotUsed) => return Ok(None),
        Err(e) => return Err(AcpiFailure::Srat(e)),
    };
    let slit = tables.find_table::<Slit>();
    let matrix = slit.as_ref().map(|s| {
        let table = s.get();
        let count = table.num_proximity_domains;
        let room = u64::from(table.header.length).saturating_sub(size_of::<Slit>() as u64);
        let len = count.saturating_mul(count).min(room) as usize;
        // SAFETY: the crate mapped the whole table (`header.length` bytes); the matrix follows
        // the fixed part and `len` stays inside the table.
        let bytes = unsafe {
            core::slice::from_raw_parts(s.as_ptr().cast::<u8>().add(size_of::<Slit>()), len)
        };
        (bytes, count as usize)
    });
    let mut distances = [0; MAX_NODES * MAX_NODES];
    layout
        .distances(matrix, &mut distances, &mut Console)
        .map_err(AcpiFailure::Srat)?;
    Ok(Some(Numa { layout, distances }))
}
