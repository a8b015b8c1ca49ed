//! `kernel_probe KERNEL fastest|portable CALLS`: runs one of the CPU kernels (`probe::call`)
//! CALLS times on the same inputs, on the fastest kernels this machine has or on the portable
//! ones. For counting instructions under qemu (`scripts/arm64/insn-counts.sh`): the difference
//! between CALLS = 3 and CALLS = 1 is two calls' worth, without the setup and one-time tables.

use mlxkern_arm64_kernels::probe;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: kernel_probe exact|decode|chunked|heads|norm fastest|portable CALLS";
    let (kernel, mode, calls) = match &args[1..] {
        [k, m, c] => (k.as_str(), m.as_str(), c.parse::<usize>().expect(usage)),
        _ => panic!("{usage}"),
    };
    probe::force_portable(match mode {
        "fastest" => false,
        "portable" => true,
        _ => panic!("{usage}"),
    });
    let mut call = probe::call(kernel);
    for _ in 0..calls {
        call();
    }
    let (units, what) = probe::work(kernel);
    println!("{kernel} {mode}: {calls} calls of {units} ({what})");
}
