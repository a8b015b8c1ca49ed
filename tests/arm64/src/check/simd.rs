//! `simd::neon`'s building blocks against their scalar counterparts.
