// The C ABI of libmlxkern for the module CMLXKern: the repository's generated header
// (include/mlxkern.h, by relative path: no copy to keep in sync) when this package sits in the
// repository; else an installed <mlxkern.h>, found through the include folder the mlxkern.pc
// that SwiftPM reads names (scripts/package/install.sh installs both). The library's ABI version is
// checked against the header's at run time (MLXKern.abiVersion).
#if __has_include("../../../include/mlxkern.h")
#include "../../../include/mlxkern.h"
#else
#include <mlxkern.h>
#endif
