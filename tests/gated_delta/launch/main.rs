//! The pool calls' GPU launches built without a GPU (`pool`: every pool call's launch;
//! `pool_chunked`: the chunked pool calls' first launch over the chunk table; `pool_in_place`:
//! the CUDA launch that writes the pool's own rows). Their own binary: they
//! record the process's last GPU launch and force the in-place pool launch, one test at a time
//! (`support::serial`).

#[path = "../../support/mod.rs"]
mod support;

mod pool;
mod pool_chunked;
mod pool_in_place;
