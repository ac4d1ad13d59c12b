//! Intel AMX tiles for bf16 products.
//!
//! Rust's standard library wraps no AMX instruction on stable, and no well-kept crate does, so
//! the three tile operations this kernel needs (configure, multiply-accumulate a 2 × 2 block of
//! tiles over a depth, store) are inline assembly here, each with the invariants it relies on
//! written next to it. Everything around them (detection, packing, blocking, threading) is safe
//! Rust in [`crate::bf16`].
//!
//! The operating system must let the process use the 8 KiB of tile state: Linux (5.16 and
//! later) grants it on `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once in
//! [`available`]. A thread loads the tile configuration before its first tile instruction
//! ([`Tiles::new`]) and releases the tiles when done (`Drop`), so no tile state outlives a task.
use std::arch::asm;
use std::sync::OnceLock;

/// Values in a tile row of bf16 operands (64 bytes).
pub(crate) const K_TILE: usize = 32;
/// Rows of a tile (and columns of an f32 result tile).
pub(crate) const TILE: usize = 16;
/// Elements in one packed operand tile (16 rows × 32 bf16).
pub(crate) const TILE_ELEMS: usize = TILE * K_TILE;

/// The tile configuration (palette 1): eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Whether this CPU has AMX-TILE and AMX-BF16 and the kernel grants the tile state (asked once).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_bf16() && request_tile_state())
}

/// CPUID leaf 7, sub-leaf 0, EDX bits 22 (AMX-BF16) and 24 (AMX-TILE).
fn cpu_has_amx_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let max_leaf = __cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 when Linux grants the tile state.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: isize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: the raw `arch_prctl` system call with an integer request and argument; it reads
    // and writes no user memory. `syscall` clobbers rcx and r11, declared; rax returns.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Proof that this thread has loaded the tile configuration; releases the tiles when dropped.
/// Not `Send`: the configuration belongs to the thread that loaded it.
pub(crate) struct Tiles {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Tiles {
    /// Load the configuration on this thread; `None` where AMX is not [`available`].
    pub(crate) fn new() -> Option<Self> {
        if !available() {
            return None;
        }
        let mut config = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            config.colsb[t] = 64;
            config.rows[t] = TILE as u8;
        }
        // SAFETY: AMX-TILE is present and the tile state granted (`available`); `config` is a
        // valid 64-byte palette-1 configuration, 64-byte aligned, alive for the instruction.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config as *const Config, options(nostack)) };
        Some(Self {
            _not_send: std::marker::PhantomData,
        })
    }

    /// A 32 × 32 block of f32 results, `C (+)= A · B`, over `chunks` depth chunks of 32.
    ///
    /// `a[0]`, `a[1]`: the two 16-row A tiles' chunk sequences (each chunk one packed tile,
    /// 16 rows × 32 bf16, rows 64 bytes apart, chunks [`TILE_ELEMS`] apart); `b[0]`, `b[1]`:
    /// the two 16-column B tiles' chunks (16 rows of k-pairs × 16 columns × 2 bf16, the VNNI
    /// layout). `c` holds the block at row stride `ldc` (in f32s): its four 16 × 16 tiles are
    /// loaded first when `accumulate`, zeroed otherwise, and written back.
    ///
    /// # Panics
    /// When a slice is shorter than the tiles read from or written to it.
    pub(crate) fn block(
        &self,
        a: [&[u16]; 2],
        b: [&[u16]; 2],
        chunks: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        let need = chunks * TILE_ELEMS;
        assert!(chunks > 0, "an empty depth");
        for s in a.iter().chain(b.iter()) {
            assert!(s.len() >= need, "a packed operand shorter than its tiles");
        }
        assert!(ldc >= 2 * TILE, "row stride below the block's width");
        assert!(
            c.len() >= (2 * TILE - 1) * ldc + 2 * TILE,
            "C shorter than the block"
        );
        let cs = ldc * 4;
        let cp = c.as_mut_ptr();
        let (c01, c10) = (TILE, TILE * ldc);
        // SAFETY (for the three blocks below): this thread loaded the configuration (`self`
        // exists only after `ldtilecfg`, and is not Send); every tile is 16 rows of 64 bytes.
        // C: the four tiles start at cp, cp+16, cp+16·ldc, cp+16·ldc+16 (f32s) and read or
        // write 16 rows of 16 f32 at stride ldc: the last byte touched is element
        // 31·ldc + 31 < c.len() (asserted). A and B: `chunks` tiles of 512 bf16 each, rows
        // 64 bytes apart, the last byte at need·2 − 1 < len·2 (asserted). The pointers move by
        // 1,024 bytes a chunk, `chunks` ≥ 1 times. No other memory is touched.
        unsafe {
            if accumulate {
                asm!(
                    "tileloadd tmm0, [{c} + {s}*1]",
                    "tileloadd tmm1, [{c1} + {s}*1]",
                    "tileloadd tmm2, [{c2} + {s}*1]",
                    "tileloadd tmm3, [{c3} + {s}*1]",
                    c = in(reg) cp,
                    c1 = in(reg) cp.add(c01),
                    c2 = in(reg) cp.add(c10),
                    c3 = in(reg) cp.add(c10 + c01),
                    s = in(reg) cs,
                    options(nostack, readonly),
                );
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            asm!(
                "2:",
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tileloadd tmm6, [{b0} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 1024",
                "add {a1}, 1024",
                "add {b0}, 1024",
                "add {b1}, 1024",
                "dec {n}",
                "jnz 2b",
                a0 = inout(reg) a[0].as_ptr() => _,
                a1 = inout(reg) a[1].as_ptr() => _,
                b0 = inout(reg) b[0].as_ptr() => _,
                b1 = inout(reg) b[1].as_ptr() => _,
                n = inout(reg) chunks => _,
                s = in(reg) 64usize,
                options(nostack, readonly),
            );
            asm!(
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                c = in(reg) cp,
                c1 = in(reg) cp.add(c01),
                c2 = in(reg) cp.add(c10),
                c3 = in(reg) cp.add(c10 + c01),
                s = in(reg) cs,
                options(nostack),
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the configuration was loaded on this thread (`Tiles::new`); `tilerelease`
        // returns the tiles to their initial state and touches no memory.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}
