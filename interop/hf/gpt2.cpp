#include "interop/hf/gpt2.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"

namespace tpt {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

class HFReader {
 public:
  explicit HFReader(const std::string& path) : st_(path) {
    prefix_ = st_.contains("transformer.wte.weight") ? "transformer." : "";
  }

  // Checks that tensor `name` exists with `shape` (or, when allow_more_rows, at least shape[0] rows).
  const std::string& check(const std::string& name, const std::vector<int64_t>& shape,
                           bool allow_more_rows = false) {
    full_ = prefix_ + name;
    if (!st_.contains(full_))
      input_error(st_.path() + ": init_from: tensor '" + full_ + "' is missing (expected shape " +
                  shape_str(shape) + ")");
    const auto& got = st_.info(full_).shape;
    bool ok = got.size() == shape.size();
    for (size_t i = 0; ok && i < got.size(); ++i)
      ok = allow_more_rows && i == 0 ? got[i] >= shape[i] : got[i] == shape[i];
    if (!ok)
      input_error(st_.path() + ": init_from: tensor '" + full_ + "' has shape " + shape_str(got) +
                  ", the model needs " + shape_str(shape));
    return full_;
  }

  // out = the box, as stored.
  void box(const std::string& name, std::vector<int64_t> off, std::vector<int64_t> size, float* out) {
    st_.read_box(name, off, size, out);
  }

  // out (cols, rows) = transpose of the box (rows, cols) at (r0, c0) of a 2-D tensor.
  void box_transposed(const std::string& name, int64_t r0, int64_t rows, int64_t c0, int64_t cols, float* out) {
    std::vector<float> tmp(size_t(rows * cols));
    st_.read_box(name, std::vector<int64_t>{r0, c0}, std::vector<int64_t>{rows, cols}, tmp.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = tmp[size_t(r * cols + c)];
  }

 private:
  SafetensorsReader st_;
  std::string prefix_;
  std::string full_;
};

}  // namespace

HFTensor hf_gpt2_name(const std::string& ours) {
  static const std::pair<const char*, HFTensor> renamed[] = {
      {"attn.qkv.weight", {"attn.c_attn.weight", true}}, {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}}, {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"mlp.fc1.weight", {"mlp.c_fc.weight", true}},      {"mlp.fc1.bias", {"mlp.c_fc.bias", false}},
      {"mlp.fc2.weight", {"mlp.c_proj.weight", true}},    {"mlp.fc2.bias", {"mlp.c_proj.bias", false}}};
  if (ours.rfind("h.", 0) == 0) {  // h.<i>.<rest>
    const size_t dot = ours.find('.', 2);
    const std::string pre = ours.substr(0, dot + 1), rest = ours.substr(dot + 1);
    for (const auto& [name, hf] : renamed)
      if (rest == name) return {pre + hf.name, hf.conv1d};
  }
  return {ours, false};  // wte, wpe, ln_f, ln_1, ln_2: the same names
}

void load_hf_gpt2(const std::string& path, const GPTDims& d, const ParamLayout& layout, float* params) {
  HFReader hf(path);
  const int64_t C = d.C, F = d.F;
  for (const ParamInfo& p : layout.params) {
    float* out = params + p.offset;
    std::fill(out, out + p.numel, 0.0f);
    const std::string& n = p.name;
    if (n == "wte.weight") {
      std::string t = hf.check("wte.weight", {d.V, C});
      if (p.box_size[0] > 0) hf.box(t, p.box_offset, p.box_size, out);
      continue;
    }
    if (n == "wpe.weight") {  // a longer position table (e.g. GPT-2's 1024) is cut to the model's
      std::string t = hf.check("wpe.weight", {d.P, C}, true);
      hf.box(t, {0, 0}, {d.P, C}, out);
      continue;
    }
    if (n == "ln_f.weight" || n == "ln_f.bias") {
      hf.box(hf.check(n, {C}), {0}, {C}, out);
      continue;
    }
    // h.<i>.<rest>
    const std::string rest = n.substr(n.find('.', 2) + 1), hf_name = hf_gpt2_name(n).name;
    if (rest == "ln_1.weight" || rest == "ln_1.bias" || rest == "ln_2.weight" || rest == "ln_2.bias" ||
        rest == "attn.proj.bias" || rest == "mlp.fc2.bias") {
      hf.box(hf.check(hf_name, {C}), {0}, {C}, out);
    } else if (rest == "attn.qkv.weight") {  // ours (3, Cl, C) <- c_attn [C, 3C] columns w*C + o
      std::string t = hf.check(hf_name, {C, 3 * C});
      for (int64_t w = 0; w < 3; ++w)
        hf.box_transposed(t, 0, C, w * C + p.box_offset[1], d.Cl, out + w * d.Cl * C);
    } else if (rest == "attn.qkv.bias") {
      std::string t = hf.check(hf_name, {3 * C});
      for (int64_t w = 0; w < 3; ++w) hf.box(t, {w * C + p.box_offset[1]}, {d.Cl}, out + w * d.Cl);
    } else if (rest == "attn.proj.weight") {  // ours (C, Cl) <- c_proj [C_in, C_out] rows of our inputs
      std::string t = hf.check(hf_name, {C, C});
      hf.box_transposed(t, p.box_offset[1], d.Cl, 0, C, out);
    } else if (rest == "mlp.fc1.weight") {  // ours (Fl, C) <- c_fc [C, F]
      std::string t = hf.check(hf_name, {C, F});
      hf.box_transposed(t, 0, C, p.box_offset[0], d.Fl, out);
    } else if (rest == "mlp.fc1.bias") {
      hf.box(hf.check(hf_name, {F}), {p.box_offset[0]}, {d.Fl}, out);
    } else if (rest == "mlp.fc2.weight") {  // ours (C, Fl) <- c_proj [F, C]
      std::string t = hf.check(hf_name, {F, C});
      hf.box_transposed(t, p.box_offset[1], d.Fl, 0, C, out);
    } else {
      internal_error("load_hf_gpt2: no mapping for parameter " + n);
    }
  }
}

}  // namespace tpt
