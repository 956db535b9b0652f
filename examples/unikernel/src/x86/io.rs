//! Port I/O: the COM1 serial console, QEMU's `isa-debug-exit` device and PCI configuration
//! space through ports `0xcf8`/`0xcfc` (for the `acpi` crate's handler).

use core::arch::asm;

/// Reads a byte from `port`.
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: port I/O touches no memory; the ports this kernel reads are devices it owns.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Reads 16 bits from `port`.
pub fn inw(port: u16) -> u16 {
    let v: u16;
    // SAFETY: as in `inb`.
    unsafe {
        asm!("in ax, dx", in("dx") port, out("ax") v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Reads 32 bits from `port`.
pub fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as in `inb`.
    unsafe {
        asm!("in eax, dx", in("dx") port, out("eax") v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Writes a byte to `port`.
pub fn outb(port: u16, v: u8) {
    // SAFETY: port I/O touches no memory; the ports this kernel writes are devices it owns.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    };
}

/// Writes 16 bits to `port`.
pub fn outw(port: u16, v: u16) {
    // SAFETY: as in `outb`.
    unsafe {
        asm!("out dx, ax", in("dx") port, in("ax") v, options(nomem, nostack, preserves_flags))
    };
}

/// Writes 32 bits to `port`.
pub fn outl(port: u16, v: u32) {
    // SAFETY: as in `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags))
    };
}

/// COM1.
const COM1: u16 = 0x3f8;

/// Sets COM1 to 115200 baud, 8N1, FIFOs on.
pub fn serial_init() {
    outb(COM1 + 1, 0x00); // no interrupts
    outb(COM1 + 3, 0x80); // divisor latch
    outb(COM1, 0x01); // 115200 baud
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03); // 8 bits, no parity, one stop bit
    outb(COM1 + 2, 0xc7); // FIFOs on and cleared
    outb(COM1 + 4, 0x03); // DTR, RTS
}

/// Writes `s` to COM1, waiting for room in the transmitter.
pub fn serial_write(s: &str) {
    for b in s.bytes() {
        while inb(COM1 + 5) & 0x20 == 0 {
            core::hint::spin_loop();
        }
        outb(COM1, b);
    }
}

/// QEMU's `isa-debug-exit` device (`-device isa-debug-exit`, at its default port 0x501):
/// writing `v` makes QEMU exit with status `2 * v + 1`.
const DEBUG_EXIT: u16 = 0x501;
/// Written on success: QEMU exits 33. Anything else QEMU can exit with (0 on a triple fault
/// under `-no-reboot`, 35 for [`EXIT_FAILURE`], 1 when the device is missing) is not this.
pub const EXIT_SUCCESS: u8 = 0x10;
/// Written on failure: QEMU exits 35.
pub const EXIT_FAILURE: u8 = 0x11;

/// Makes QEMU exit through `isa-debug-exit`; returns only if the device is missing.
pub fn debug_exit(code: u8) {
    outb(DEBUG_EXIT, code);
}

/// The configuration-space address of a PCI function's 32-bit register at `offset`
/// (configuration mechanism #1, segment 0 only).
fn pci_address(bus: u8, device: u8, function: u8, offset: u16) -> u32 {
    (1 << 31)
        | (u32::from(bus) << 16)
        | (u32::from(device & 0x1f) << 11)
        | (u32::from(function & 0x7) << 8)
        | u32::from(offset & 0xfc)
}

/// Reads the 32-bit configuration register that holds `offset`.
pub fn pci_read(bus: u8, device: u8, function: u8, offset: u16) -> u32 {
    outl(0xcf8, pci_address(bus, device, function, offset));
    inl(0xcfc)
}

/// Writes the 32-bit configuration register that holds `offset`.
pub fn pci_write(bus: u8, device: u8, function: u8, offset: u16, v: u32) {
    outl(0xcf8, pci_address(bus, device, function, offset));
    outl(0xcfc, v);
}
