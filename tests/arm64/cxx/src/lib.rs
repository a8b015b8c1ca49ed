//! `cxx::Exception` as `src/error.rs` uses it: the message of a C++ exception.

#[derive(Debug)]
pub struct Exception(String);

impl Exception {
    pub fn what(&self) -> &str {
        &self.0
    }
}
