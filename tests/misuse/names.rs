//! The argument names a refusal's message may use: the parameters of the function that refused,
//! as `include/mlxkern.h` declares them. A message names the argument first
//! (`function: argument: ...`); any other word in it that is a parameter of some entry point
//! (a name with an underscore, such as `n_lengths` or `accepted_lengths`) must be a parameter of
//! this one too, so that no message names an argument of another call.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// Every function of the header with its parameter names, in order.
fn header() -> &'static BTreeMap<String, Vec<String>> {
    static HEADER: OnceLock<BTreeMap<String, Vec<String>>> = OnceLock::new();
    HEADER.get_or_init(|| {
        let text = include_str!("../../include/mlxkern.h");
        let mut functions = BTreeMap::new();
        for line in text.lines() {
            let Some(open) = line.find('(') else { continue };
            if !line.ends_with(");") || line.starts_with(' ') || line.starts_with('#') {
                continue;
            }
            let Some(name) = line[..open].split_whitespace().last() else {
                continue;
            };
            let name = name.trim_start_matches('*');
            if !name.starts_with("mlxk_") {
                continue;
            }
            let params = line[open + 1..line.len() - 2]
                .split(',')
                .filter_map(|p| {
                    let p = p.trim();
                    (p != "void" && !p.is_empty()).then(|| {
                        let last = p.split_whitespace().last().unwrap_or("");
                        last.trim_start_matches('*').to_string()
                    })
                })
                .collect();
            functions.insert(name.to_string(), params);
        }
        functions
    })
}

/// The parameter names of any entry point that contain an underscore (words of prose never do).
fn all_compound_parameters() -> &'static BTreeSet<String> {
    static ALL: OnceLock<BTreeSet<String>> = OnceLock::new();
    ALL.get_or_init(|| {
        header()
            .values()
            .flatten()
            .filter(|p| p.contains('_'))
            .cloned()
            .collect()
    })
}

/// Panics unless `msg` (`function: argument: ...`) names only parameters of `function`.
#[track_caller]
pub fn names_only_its_parameters(function: &str, msg: &str) {
    let params = header()
        .get(function)
        .unwrap_or_else(|| panic!("{function} is not declared in include/mlxkern.h"));
    let rest = msg
        .strip_prefix(function)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or_else(|| panic!("message does not start with {function}: {msg:?}"));
    // The argument the message is about: the leading name, without an index (`slots[2]`).
    let lead: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    // Buffers the call makes for itself are named as such: `g (internal)`, `the rows' states
    // (internal)`.
    let first = rest.split([',', ':']).next().unwrap_or("");
    let internal = first.ends_with("(internal)");
    assert!(
        internal || params.contains(&lead),
        "{function}: message {msg:?} leads with {lead:?}, which is not one of its parameters \
         {params:?}"
    );
    for word in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if all_compound_parameters().contains(word) {
            assert!(
                params.iter().any(|p| p == word),
                "{function}: message {msg:?} names {word:?}, a parameter of another call"
            );
        }
    }
}

#[test]
fn the_header_is_read() {
    let h = header();
    assert!(h.len() >= 40, "{} functions read", h.len());
    assert_eq!(
        h["mlxk_gated_delta_state_pool"].last().map(String::as_str),
        Some("pool_out")
    );
    assert!(h["mlxk_gated_delta_state"].iter().any(|p| p == "n_lengths"));
}

#[test]
fn a_message_naming_another_calls_parameter_is_caught() {
    let caught = std::panic::catch_unwind(|| {
        names_only_its_parameters(
            "mlxk_gated_delta_state_pool",
            "mlxk_gated_delta_state_pool: accepted_lengths: n_lengths is 2, expected one length \
             per batch row (B = 3)",
        )
    });
    assert!(caught.is_err());
    names_only_its_parameters(
        "mlxk_gated_delta_state_pool",
        "mlxk_gated_delta_state_pool: accepted_lengths: n_slots is 2, expected one length per \
         batch row (B = 3)",
    );
}
