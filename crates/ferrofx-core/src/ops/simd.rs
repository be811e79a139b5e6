//! Runtime selection of vector instruction sets for hot loops.
//!
//! The crate is compiled for x86-64's baseline (SSE2), so that one binary runs everywhere. Loops
//! that gain from wider vectors (AVX2, AVX-512: more lanes, blends, masked selects, FMA) are
//! written once as plain Rust and compiled several times by [`simd_dispatch!`]; the best
//! version the CPU supports is picked at run time (the feature checks are cached atomics).

/// Whether the CPU has AVX-512F (a cached check; never, off x86-64): the condition of the
/// hand-written AVX-512 kernels (the direct convolutions, the float32 max-pool).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512f() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Whether the CPU has AVX-512F (a cached check; never, off x86-64).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn avx512f() -> bool {
    false
}

/// Defines `fn $name` whose body is compiled three times: for AVX-512 (with AVX2 and FMA), for
/// AVX2 with FMA, and for the baseline; each call runs the widest version the CPU supports.
/// Supports one generic type parameter with one bound (`fn f<T: Element>(...)`). The body must
/// be safe code; the only `unsafe` is the call of a `#[target_feature]` function after its
/// features have been checked.
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$g:ident : $b:path>)? ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name $(<$g: $b>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body $(<$g: $b>)? ($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512 $(<$g: $b>)? ($($arg: $ty),*) $(-> $ret)? {
                    body $(::<$g>)? ($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2 $(<$g: $b>)? ($($arg: $ty),*) $(-> $ret)? {
                    body $(::<$g>)? ($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the features `avx512` is compiled for (checked
                    // just above); its body is safe code.
                    return unsafe { avx512 $(::<$g>)? ($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: as above, for AVX2 and FMA.
                    return unsafe { avx2 $(::<$g>)? ($($arg),*) };
                }
            }
            body $(::<$g>)? ($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;
