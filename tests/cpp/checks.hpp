// The check counts of a C++ test program (tests/cpp/) and its CHECK: a failed check prints
// "FAIL (file:line): what", file being the program's source file. Included once, by the
// program's one source file; the program prints `passed` and `failed` at the end.
#ifndef MLXK_TESTS_CPP_CHECKS_HPP
#define MLXK_TESTS_CPP_CHECKS_HPP

#include <cstdio>
#include <cstring>

namespace {

int passed = 0;
int failed = 0;

void check_at(bool ok, const char *what, int line) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    const char *slash = std::strrchr(__BASE_FILE__, '/');
    std::fprintf(stderr, "FAIL (%s:%d): %s\n", slash != nullptr ? slash + 1 : __BASE_FILE__,
                 line, what);
  }
}

}  // namespace

#define CHECK(cond) check_at((cond), #cond, __LINE__)

#endif
