//! Freed, foreign and NULL handles in every handle argument; double free; lazy results
//! that outlive their freed inputs.

use super::*;

/// Pointers that were never handles. None is ever dereferenced by the library (the C stress
/// test and the fuzz targets check that under AddressSanitizer).
fn foreign_pointers(live: H) -> Vec<(String, H)> {
    let local = 0u64;
    let heap = Box::new([0u64; 8]);
    let gone = Box::new([0u64; 8]);
    let dangling = &*gone as *const [u64; 8] as usize;
    drop(gone);
    let handle_var = live;
    let host = vec![1.0f32; 4];
    let out = vec![
        ("a stack address".to_string(), &local as *const u64 as H),
        ("a heap address".to_string(), &*heap as *const [u64; 8] as H),
        ("a dangling heap address".to_string(), dangling as H),
        (
            "the address of a handle variable (&h for h)".to_string(),
            &handle_var as *const H as H,
        ),
        ("a host data pointer".to_string(), host.as_ptr() as H),
        ("an odd address".to_string(), 0x1001 as H),
        ("a small integer".to_string(), 8 as H),
        ("the highest address".to_string(), usize::MAX as H),
        (
            "a forged token never handed out".to_string(),
            (live as usize + 8 * 1_000_000_000) as H,
        ),
    ];
    // The addresses stay meaningful (stack frame gone, heap box leaked on purpose is not
    // needed): the library compares values only.
    std::mem::forget(heap);
    out
}

#[test]
fn every_handle_argument_refuses_freed_foreign_and_null_handles() {
    let _s = serial();
    let fx = Fixture::new();
    // A freed handle, and one freed on another thread.
    let freed = new_f32(&[1.0], &[1]);
    free(freed);
    let freed_elsewhere = new_f32(&[1.0], &[1]) as usize;
    std::thread::spawn(move || free(freed_elsewhere as H))
        .join()
        .unwrap();
    let mut cases: Vec<(String, H)> = vec![
        ("a freed handle".into(), freed),
        (
            "a handle freed on another thread".into(),
            freed_elsewhere as H,
        ),
    ];
    cases.extend(foreign_pointers(fx.arr));
    let mut checked = 0;
    for e in fx.entries() {
        e.succeeds();
        for i in 0..e.args.len() {
            for (what, bad) in &cases {
                e.refuses(i, *bad, MLXK_ERR_INVALID_HANDLE, what);
                checked += 1;
            }
            if e.optional.contains(&e.args[i].0) {
                // NULL means absent: still a success.
                let mut h = e.handles();
                h[i] = null_mut();
                let (st, outs, _) = (e.call)(&h);
                assert_eq!(
                    st,
                    MLXK_OK,
                    "{} with NULL {}: {}",
                    e.function,
                    e.args[i].0,
                    last_error()
                );
                outs.into_iter().for_each(free);
            } else {
                e.refuses(i, null_mut(), MLXK_ERR_NULL_POINTER, "NULL");
            }
            checked += 1;
        }
        // The valid arguments still work after all that.
        e.succeeds();
    }
    eprintln!("{checked} refused handle arguments checked");
    fx.free();
}

#[test]
fn double_free_and_free_of_foreign_pointers() {
    let _s = serial();
    let a = new_f32(&[1.0, 2.0], &[2]);
    let before = live_handles();
    ok(mlxk_array_free(a));
    assert_eq!(live_handles(), before - 1);
    for _ in 0..3 {
        refused(
            mlxk_array_free(a),
            MLXK_ERR_INVALID_HANDLE,
            "mlxk_array_free",
            &["array", "not a live"],
            before - 1,
        );
    }
    for (what, p) in foreign_pointers(a) {
        let n = live_handles();
        let st = mlxk_array_free(p);
        assert_eq!(st, MLXK_ERR_INVALID_HANDLE, "freeing {what}");
        assert_eq!(live_handles(), n);
    }
    ok(mlxk_array_free(null_mut()));
    // A handle freed on another thread is dead here, and freeing it again here is refused.
    let b = new_f32(&[3.0], &[1]) as usize;
    std::thread::spawn(move || ok(mlxk_array_free(b as H)))
        .join()
        .unwrap();
    let n = live_handles();
    refused(
        mlxk_array_free(b as H),
        MLXK_ERR_INVALID_HANDLE,
        "mlxk_array_free",
        &["array"],
        n,
    );
    refused(
        mlxk_array_eval(b as H),
        MLXK_ERR_INVALID_HANDLE,
        "mlxk_array_eval",
        &["array"],
        n,
    );
    // A handle made on one thread works on another.
    let c = new_f32(&[4.0, 5.0], &[2]) as usize;
    let read = std::thread::spawn(move || read_f32(c as H)).join().unwrap();
    assert_eq!(read, vec![4.0, 5.0]);
    free(c as H);
}

#[test]
fn lazy_results_outlive_their_freed_inputs() {
    let _s = serial();
    let a = new_f32(&[1.5, -2.25, 3.0], &[3]);
    let mut b = null_mut();
    ok(unsafe { mlxk_array_astype(a, MLXK_DTYPE_BFLOAT16, &mut b) });
    free(a);
    assert_eq!(read_bf16(b), vec![1.5, -2.25, 3.0]);
    free(b);
}
