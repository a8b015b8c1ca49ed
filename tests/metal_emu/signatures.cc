// Writes the emulated kernels and launches (emu_gen.inc) from the launch list that
// tests/metal_emu/launches.rs prints from src/metal/.
//
// The kernel text comes from MLX itself: each launch is handed to mx::fast::metal_kernel exactly
// as src/bridge/mlx_bridge.cc's metal_kernel_op does (names, source, header, template arguments:
// integers then dtypes, ensure_row_contiguous, the inputs' dtypes and shapes), under export
// tracing, which lets MLX build the CustomKernel primitive without a Metal device. Its state
// holds the full source MLX would compile: the signature MLX's write_signature generates
// (template parameters, `const device T*` / `const constant T*` / `const constant T&` inputs,
// `device T*` outputs, the thread attributes whose names appear in the source), the body, and
// the explicit instantiation. The body is checked to be the launch's source verbatim and is
// replaced by an #include of the kernel file it came from, with the library's marker
// substitution as a #define, so the compiled body is the file the library embeds.
//
// Usage: signatures <launch list> <output file>
// Build: C++20 (MLX's headers), linked with libmlx.

#include <mlx/mlx.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace mx = mlx::core;

namespace {

struct Tensor {
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
};

struct Launch {
  int id = -1;
  std::string kind, label, name, file, header, source;
  int dtype = 0, aux = 0, masked = 0, with_state = 0, checkpoint = 0, twin = -1;
  std::vector<int64_t> dims;
  std::vector<int32_t> lengths, slots, fresh, cu_seqlens;
  int pool_n = 0;
  uint32_t eps_bits = 0;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> defines;
  std::vector<Tensor> inputs, outputs;
  int grid[3] = {0, 0, 0}, threadgroup[3] = {0, 0, 0};
  std::vector<std::pair<std::string, int>> tints, tdtypes;
};

[[noreturn]] void die(const std::string& message) {
  std::cerr << "metal-emu signatures: " << message << std::endl;
  std::exit(1);
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The launch list's keys of one integer, of a line of text and of a list of integers.
const std::map<std::string, int Launch::*> kInts = {
    {"dtype", &Launch::dtype},           {"aux_dtype", &Launch::aux},
    {"masked", &Launch::masked},         {"with_state", &Launch::with_state},
    {"checkpoint", &Launch::checkpoint}, {"twin", &Launch::twin},
    {"pool_n", &Launch::pool_n}};
const std::map<std::string, std::string Launch::*> kTexts = {
    {"kind", &Launch::kind}, {"label", &Launch::label}, {"name", &Launch::name},
    {"file", &Launch::file}};
const std::map<std::string, std::vector<int32_t> Launch::*> kLists = {
    {"lengths", &Launch::lengths}, {"slots", &Launch::slots}, {"fresh", &Launch::fresh},
    {"cu_seqlens", &Launch::cu_seqlens}};

std::vector<Launch> read_launches(const std::string& path) {
  std::ifstream in(path);
  if (!in) die("cannot read " + path);
  std::vector<Launch> launches;
  Launch l;
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
    std::istringstream s(rest);
    if (key == "case") {
      l = Launch();
      s >> l.id;
    } else if (const auto one = kInts.find(key); one != kInts.end()) {
      s >> l.*(one->second);
    } else if (const auto text = kTexts.find(key); text != kTexts.end()) {
      l.*(text->second) = rest;
    } else if (const auto list = kLists.find(key); list != kLists.end()) {
      for (int32_t d; s >> d;) (l.*(list->second)).push_back(d);
    } else if (key == "dims") {
      for (int64_t d; s >> d;) l.dims.push_back(d);
    } else if (key == "eps_bits") {
      s >> l.eps_bits;
    } else if (key == "seed") {
      s >> l.seed;
    } else if (key == "define") {
      const size_t at = rest.find(' ');
      l.defines.emplace_back(rest.substr(0, at), rest.substr(at + 1));
    } else if (key == "input" || key == "output") {
      Tensor t;
      s >> t.name >> t.dtype;
      for (int64_t d; s >> d;) t.shape.push_back(d);
      (key == "input" ? l.inputs : l.outputs).push_back(t);
    } else if (key == "grid") {
      s >> l.grid[0] >> l.grid[1] >> l.grid[2];
    } else if (key == "threadgroup") {
      s >> l.threadgroup[0] >> l.threadgroup[1] >> l.threadgroup[2];
    } else if (key == "tint" || key == "tdtype") {
      std::string n;
      int v;
      s >> n >> v;
      (key == "tint" ? l.tints : l.tdtypes).emplace_back(n, v);
    } else if (key == "header") {
      l.header = unhex(rest);
    } else if (key == "source") {
      l.source = unhex(rest);
    } else if (key == "end") {
      launches.push_back(l);
    } else if (!key.empty()) {
      die("unknown key " + key + " in " + path);
    }
  }
  if (launches.empty()) die("no launches in " + path);
  return launches;
}

mx::Dtype to_mlx(int code) {
  // The mlxk_dtype codes (include/mlxkern.h), as src/bridge/mlx_bridge.cc maps them.
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::int8;
    case 3: return mx::int32;
    case 4: return mx::uint32;
    case 5: return mx::float16;
    case 6: return mx::bfloat16;
    case 7: return mx::float32;
  }
  die("unknown dtype code " + std::to_string(code));
}

mx::Shape to_shape(const std::vector<int64_t>& dims) {
  mx::Shape shape;
  for (auto d : dims) shape.push_back(static_cast<int>(d));
  return shape;
}

// The source MLX generates for the launch (see the file comment).
std::string mlx_kernel_source(const Launch& l) {
  std::vector<std::string> input_names, output_names;
  for (auto& t : l.inputs) input_names.push_back(t.name);
  for (auto& t : l.outputs) output_names.push_back(t.name);
  auto kernel = mx::fast::metal_kernel(l.name, input_names, output_names, l.source, l.header,
                                       /*ensure_row_contiguous=*/true, /*atomic_outputs=*/false);
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  for (auto& t : l.outputs) {
    shapes.push_back(to_shape(t.shape));
    dtypes.push_back(to_mlx(t.dtype));
  }
  std::vector<std::pair<std::string, mx::fast::TemplateArg>> template_args;
  for (auto& [n, v] : l.tints) template_args.emplace_back(n, v);
  for (auto& [n, v] : l.tdtypes) template_args.emplace_back(n, to_mlx(v));
  std::vector<mx::array> placeholders;
  for (auto& t : l.inputs) placeholders.push_back(mx::zeros(to_shape(t.shape), to_mlx(t.dtype)));
  auto fun = [&](const mx::Args& args) {
    return kernel(args, shapes, dtypes, {l.grid[0], l.grid[1], l.grid[2]},
                  {l.threadgroup[0], l.threadgroup[1], l.threadgroup[2]}, template_args,
                  std::nullopt, false, mx::Device(mx::Device::gpu));
  };
  std::vector<std::string> found;
  auto callback = [&](const mx::ExportCallbackInput& node) {
    auto type = node.find("type");
    auto name = node.find("name");
    auto arguments = node.find("arguments");
    if (type == node.end() || name == node.end() || arguments == node.end()) return;
    auto* t = std::get_if<std::string>(&type->second);
    auto* n = std::get_if<std::string>(&name->second);
    auto* a = std::get_if<std::vector<mx::StateT>>(&arguments->second);
    if (!t || !n || !a || *t != "primitive" || *n != "CustomKernel") return;
    for (auto& state : *a) {
      if (auto* s = std::get_if<std::string>(&state); s && s->find("[[kernel]]") != std::string::npos) {
        found.push_back(*s);
      }
    }
  };
  mx::export_function(callback, fun, placeholders);
  if (found.size() != 1) {
    die("launch " + std::to_string(l.id) + ": expected one CustomKernel source from MLX, got " +
        std::to_string(found.size()));
  }
  return found[0];
}

struct Param {
  std::string declaration;  // e.g. "const device bfloat16_t* q"
  std::string name;
  bool buffer = false;
  bool reference = false;
};

struct Kernel {
  std::string name;        // MLX's kernel name
  std::string signature;   // everything before the body
  std::string instantiation;
  std::string call;        // NAME<ARGS> or NAME
  std::vector<Param> params;
  std::string file;
  std::string header;  // the launch's header (inside `signature` as MLX puts it)
  std::vector<std::pair<std::string, std::string>> defines;
  std::vector<int> cases;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n");
  const size_t b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

Kernel split_kernel(const Launch& l, const std::string& text) {
  Kernel k;
  const size_t at = text.find(l.source);
  if (at == std::string::npos || text.find(l.source, at + 1) != std::string::npos) {
    die("launch " + std::to_string(l.id) + ": MLX's text does not hold the source exactly once");
  }
  k.signature = text.substr(0, at);
  const std::string tail = text.substr(at + l.source.size());
  if (k.signature.size() < 4 || k.signature.compare(k.signature.size() - 4, 4, ") {\n") != 0) {
    die("launch " + std::to_string(l.id) + ": the signature does not end with \") {\"");
  }
  if (tail.compare(0, 3, "\n}\n") != 0) {
    die("launch " + std::to_string(l.id) + ": the body is not followed by \"\\n}\"");
  }
  k.instantiation = trim(tail.substr(3));
  // Name and parameters.
  const std::string marker = "[[kernel]] void ";
  const size_t name_at = k.signature.find(marker);
  const size_t open = k.signature.find("(\n", name_at);
  if (name_at == std::string::npos || open == std::string::npos) die("unexpected signature");
  k.name = k.signature.substr(name_at + marker.size(), open - name_at - marker.size());
  std::istringstream lines(k.signature.substr(open + 2));
  for (std::string line; std::getline(lines, line);) {
    line = trim(line);
    if (line.size() >= 3 && line.compare(line.size() - 3, 3, ") {") == 0) {
      line = line.substr(0, line.size() - 3);
    } else if (!line.empty() && line.back() == ',') {
      line.pop_back();
    }
    if (line.empty()) continue;
    const size_t attribute = line.find(" [[");
    if (attribute == std::string::npos) die("parameter without attribute: " + line);
    Param p;
    p.declaration = line.substr(0, attribute);
    p.buffer = line.find("[[buffer(", attribute) != std::string::npos;
    p.name = p.declaration.substr(p.declaration.find_last_of(" *&") + 1);
    p.reference = p.declaration.find('&') != std::string::npos;
    k.params.push_back(p);
  }
  // The callee: the template specialization the instantiation names, or the plain function.
  k.call = k.name;
  if (!k.instantiation.empty()) {
    const std::string d = "decltype(";
    const size_t from = k.instantiation.find(d);
    const size_t to = k.instantiation.find(") ", from);
    if (from == std::string::npos || to == std::string::npos) die("unexpected instantiation");
    k.call = k.instantiation.substr(from + d.size(), to - from - d.size());
  }
  k.file = l.file;
  k.header = l.header;
  k.defines = l.defines;
  return k;
}

// The macros `header` defines that are no include guards (a #define right after an #ifndef
// of the same name).
std::vector<std::string> header_switches(const std::string& header) {
  std::vector<std::string> names;
  std::istringstream lines(header);
  std::string previous;
  for (std::string line; std::getline(lines, line);) {
    line = trim(line);
    if (line.empty()) continue;
    const std::string define = "#define ";
    if (line.compare(0, define.size(), define) == 0) {
      std::string name = line.substr(define.size());
      name = name.substr(0, name.find_first_of(" (\t"));
      if (previous != "#ifndef " + name) names.push_back(name);
    }
    previous = line;
  }
  return names;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string tensor_init(const Tensor& t) {
  std::ostringstream o;
  o << "{" << quote(t.name) << ", " << t.dtype << ", " << t.shape.size() << ", {";
  for (size_t i = 0; i < t.shape.size(); ++i) o << (i ? ", " : "") << t.shape[i];
  o << "}}";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: signatures <launch list> <output file>");
  const auto launches = read_launches(argv[1]);
  std::map<std::string, Kernel> kernels;
  std::vector<std::string> order;
  std::vector<std::string> case_kernel;
  for (const auto& l : launches) {
    const std::string text = mlx_kernel_source(l);
    Kernel k = split_kernel(l, text);
    auto it = kernels.find(k.name);
    if (it == kernels.end()) {
      order.push_back(k.name);
      it = kernels.emplace(k.name, k).first;
    } else if (it->second.signature != k.signature || it->second.file != k.file ||
               it->second.defines != k.defines) {
      die("kernel " + k.name + " generated twice with different text");
    }
    it->second.cases.push_back(l.id);
    case_kernel.push_back(k.name);
  }

  std::ostringstream o;
  o << "// Generated by tests/metal_emu/signatures.cc (MLX " << mx::version()
    << ") from the launch descriptions of src/metal/: do not edit.\n"
    << "// Each kernel: the signature mx::fast::metal_kernel generates for the launch, then the\n"
    << "// kernel file itself as the body, then MLX's explicit instantiation.\n\n";
  for (const auto& name : order) {
    const Kernel& k = kernels.at(name);
    o << "// ---- cases";
    for (int c : k.cases) o << " " << c;
    o << "\n" << k.signature;
    for (auto& [marker, text] : k.defines) o << "#define " << marker << " " << text << "\n";
    o << "#include \"" << k.file << "\"\n";
    for (auto& [marker, text] : k.defines) o << "#undef " << marker << "\n";
    o << "}\n";
    // MLX compiles each kernel as a program of its own; here they share one file, so the
    // switches a launch's header defines end with its kernel (include guards stay).
    for (const auto& name : header_switches(k.header)) o << "#undef " << name << "\n";
    if (!k.instantiation.empty()) o << "\n" << k.instantiation << "\n";
    o << "\n";
  }
  o << "namespace emu_gen {\n\n";
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    const Kernel& k = kernels.at(case_kernel[i]);
    o << "static emu::Stats launch_" << l.id << "(void* const* in, void* const* out) {\n"
      << "  return emu::dispatch({" << l.grid[0] << ", " << l.grid[1] << ", " << l.grid[2]
      << "}, {" << l.threadgroup[0] << ", " << l.threadgroup[1] << ", " << l.threadgroup[2]
      << "}, [&](const emu::ThreadCoords& c) {\n"
      << "    const MetalThreadAttributes a = metal_thread_attributes(c);\n"
      << "    (void)a;\n"
      << "    " << k.call << "(";
    bool first = true;
    for (const Param& p : k.params) {
      o << (first ? "\n        " : ",\n        ");
      first = false;
      if (!p.buffer) {
        o << "a." << p.name;
        continue;
      }
      int index = -1;
      bool input = true;
      for (size_t j = 0; j < l.inputs.size(); ++j) {
        if (l.inputs[j].name == p.name) index = static_cast<int>(j);
      }
      // `<input>_shape`: MLX passes the input's shape as int32 values (the text uses it when it
      // names it); here a constant array of the launch's shape for that input.
      const std::string suffix = "_shape";
      if (index < 0 && p.name.size() > suffix.size() &&
          p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        const std::string of = p.name.substr(0, p.name.size() - suffix.size());
        for (const auto& t : l.inputs) {
          if (t.name != of) continue;
          std::string values;
          for (size_t j = 0; j < t.shape.size(); ++j) {
            values += (j ? ", " : "") + std::to_string(t.shape[j]);
          }
          std::string type = trim(p.declaration.substr(0, p.declaration.size() - p.name.size()));
          o << "[]() { static const int s[] = {" << values << "}; return static_cast<" << type
            << ">(s); }()";
          index = -2;
        }
        if (index == -2) continue;
      }
      if (index < 0) {
        input = false;
        for (size_t j = 0; j < l.outputs.size(); ++j) {
          if (l.outputs[j].name == p.name) index = static_cast<int>(j);
        }
      }
      if (index < 0) die("buffer parameter " + p.name + " is neither an input nor an output");
      // The declared type: the declaration without its name, & becoming *.
      std::string type = trim(p.declaration.substr(0, p.declaration.size() - p.name.size()));
      if (p.reference) type.back() = '*';
      o << (p.reference ? "*" : "") << "static_cast<" << type << ">(" << (input ? "in" : "out")
        << "[" << index << "])";
    }
    o << ");\n  });\n}\n\n";
  }
  o << "static const EmuCase kCases[] = {\n";
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    o << "  {" << l.id << ", " << quote(l.kind) << ", " << quote(l.label) << ", "
      << quote(case_kernel[i]) << ", " << quote(l.file) << ", " << l.dtype << ", " << l.aux
      << ", " << l.dims.size() << ", {";
    for (size_t j = 0; j < l.dims.size(); ++j) o << (j ? ", " : "") << l.dims[j];
    o << "}, " << l.masked << ", " << l.with_state << ", " << l.lengths.size() << ", {";
    for (size_t j = 0; j < l.lengths.size(); ++j) o << (j ? ", " : "") << l.lengths[j];
    auto ints = [&o](const std::vector<int32_t>& v) {
      o << v.size() << ", {";
      for (size_t j = 0; j < v.size(); ++j) o << (j ? ", " : "") << v[j];
      o << "}";
    };
    o << "}, " << l.checkpoint << ", " << l.twin << ", " << l.pool_n << ", ";
    if (l.slots.size() > 16 || l.fresh.size() != l.slots.size() || l.cu_seqlens.size() > 17) {
      die("launch " + std::to_string(l.id) + ": at most 16 slots, one fresh flag each");
    }
    ints(l.slots);
    o << ", {";
    for (size_t j = 0; j < l.fresh.size(); ++j) o << (j ? ", " : "") << l.fresh[j];
    o << "}, ";
    ints(l.cu_seqlens);
    o << ", " << l.eps_bits << "u, " << l.seed << "ull, {" << l.grid[0] << ", " << l.grid[1]
      << ", " << l.grid[2] << "}, {" << l.threadgroup[0] << ", " << l.threadgroup[1] << ", "
      << l.threadgroup[2] << "}, " << l.inputs.size() << ", {";
    for (size_t j = 0; j < l.inputs.size(); ++j) o << (j ? ", " : "") << tensor_init(l.inputs[j]);
    o << "}, " << l.outputs.size() << ", {";
    for (size_t j = 0; j < l.outputs.size(); ++j) {
      o << (j ? ", " : "") << tensor_init(l.outputs[j]);
    }
    o << "}, &launch_" << l.id << "},\n";
  }
  o << "};\n\n}  // namespace emu_gen\n";

  std::ofstream out(argv[2]);
  out << o.str();
  if (!out) die(std::string("cannot write ") + argv[2]);
  std::cout << "metal-emu: " << kernels.size() << " kernel signatures from MLX "
            << mx::version() << " for " << launches.size() << " launches" << std::endl;
  return 0;
}
