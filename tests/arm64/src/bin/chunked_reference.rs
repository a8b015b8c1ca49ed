//! Writes the chunked case's outputs (`reference::chunked_case_bits`) computed by this machine's
//! kernels to the file named by the first argument; on a machine without the fused products
//! (x86-64 without AVX2 and FMA) it says so and writes nothing.

use mlxkern_arm64_kernels::reference::{chunked_case_bits, fused_products, to_bytes};

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: chunked_reference OUT");
    if !fused_products() {
        println!("chunked_reference: no AVX2 + FMA here; no reference written");
        return;
    }
    std::fs::write(&path, to_bytes(&chunked_case_bits())).expect("write the reference");
    println!("chunked_reference: wrote {path}");
}
