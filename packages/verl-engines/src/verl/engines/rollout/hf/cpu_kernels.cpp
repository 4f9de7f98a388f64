// verl's fused CPU kernels for the hf rollout's eager decode step (see cpu_kernels.py for why and when).
// fp32 only. Built at run time by torch.utils.cpp_extension with -ffp-contract=off, so that a * b + c
// rounds twice, as torch's elementwise kernels do (the rotary embedding is then bit-equal to
// transformers'). The 8-lane vectors are GCC's vector extensions: AVX2 where the build enables it, two
// SSE/NEON registers elsewhere. At the end, LayerStep: a decoder layer's whole decode step (fused_layer.py)
// on these kernels and oneDNN's products, one call from Python per layer.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

namespace {

// The largest head dim decode_attention takes (its per-thread query and output registers); Python reads it
// as MAX_HEAD_DIM and sends larger heads to torch's attention.
constexpr int64_t kMaxHeadDim = 256;

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));

inline v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline void store8(float* p, v8 v) { *reinterpret_cast<v8u*>(p) = v; }
inline float hsum8(v8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// exp(x) for x <= 0, 8 lanes: Cephes' expf (range reduction by ln 2 in two parts, a degree-6
// polynomial; within 2 ulp of the exact value). x below -87.3 (where expf underflows, and -inf, a
// masked slot) gives exactly 0.
inline v8 exp8_nonpositive(v8 x) {
  const v8i underflow = x < -87.3f;
  x = underflow ? v8{} - 87.3f : x;
  const v8 shifter = v8{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const v8 n = (x * 1.44269504088896341f + shifter) - shifter;
  v8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8 p = v8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
  const v8 result = p * two_to_n;
  return underflow ? v8{} : result;
}

void check_fp32_cpu(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, " must be an fp32 CPU tensor");
}

// x * cos + rotate_half(x) * sin for x [b, heads, s, d] into out [b, heads, s, d] (contiguous); cos and
// sin [b, s, d], any strides but the last.
void rotate_into(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t b = x.size(0), heads = x.size(1), s = x.size(2), d = x.size(3), half = d / 2;
  const float* px = x.data_ptr<float>();
  const float* pc = cos.data_ptr<float>();
  const float* ps = sin.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int64_t xb = x.stride(0), xh = x.stride(1), xs = x.stride(2);
  const int64_t cb = cos.stride(0), cs = cos.stride(1), sb = sin.stride(0), ss = sin.stride(1);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < s; ++t) {
        const float* src = px + i * xb + h * xh + t * xs;
        const float* c = pc + i * cb + t * cs;
        const float* sn = ps + i * sb + t * ss;
        float* dst = po + ((i * heads + h) * s + t) * d;
        for (int64_t j = 0; j < half; ++j) dst[j] = src[j] * c[j] + (-src[j + half]) * sn[j];
        for (int64_t j = half; j < d; ++j) dst[j] = src[j] * c[j] + src[j - half] * sn[j];
      }
}

}  // namespace

// weight * (x * rsqrt(mean(x^2) + eps)) over the last dimension (transformers' Llama RMSNorm in fp32).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_fp32_cpu(x, "x");
  check_fp32_cpu(weight, "weight");
  const int64_t width = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == width && weight.is_contiguous(), "weight must be [", width, "]");
  auto input = x.contiguous();
  auto out = torch::empty_like(input);
  const int64_t rows = width ? input.numel() / width : 0;
  const float* in = input.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    float* dst = o + r * width;
    int64_t i = 0;
    v8 lanes{};
    for (; i + 8 <= width; i += 8) {
      const v8 v = load8(row + i);
      lanes += v * v;
    }
    float sum = hsum8(lanes);
    for (; i < width; ++i) sum += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(width) + epsilon);
    for (int64_t j = 0; j < width; ++j) dst[j] = w[j] * (row[j] * inv);
  }
  return out;
}

// transformers' apply_rotary_pos_emb(q, k, cos, sin) for q [b, heads, s, d], k [b, kv heads, s, d] and
// cos, sin [b, s, d] (broadcast batch allowed through a 0 stride): the same operations in the same order,
// so the results are bit-equal. Returns contiguous [q, k].
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  for (const auto* t : {&q, &k, &cos, &sin}) check_fp32_cpu(*t, "rotary inputs");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.dim() == 3, "rotary takes 4-d q, k and 3-d cos, sin");
  const int64_t b = q.size(0), s = q.size(2), d = q.size(3);
  TORCH_CHECK(k.size(0) == b && k.size(2) == s && k.size(3) == d && d % 2 == 0, "q and k must agree in b, s and d (even)");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == b && cos.size(1) == s && cos.size(2) == d,
              "cos and sin must be [b, s, d]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && cos.stride(2) == 1 && sin.stride(2) == 1,
              "the last dimension must be contiguous");
  auto q_out = torch::empty(q.sizes(), q.options());
  auto k_out = torch::empty(k.sizes(), k.options());
  rotate_into(q, cos, sin, q_out);
  rotate_into(k, cos, sin, k_out);
  return {q_out, k_out};
}

namespace {

// One (row, KV head) of decode_attention, its query heads one after the other (the keys and values stay in
// the core's cache), with CHUNKS = d / 8 known at compile time (0: read from `chunks_`) so that a query's
// and an output's 8-lane pieces stay in registers. Writes the group's outputs, [group, d], to `out`.
template <int CHUNKS>
void attend_one(const float* qbase, int64_t qh, const float* kbase, int64_t ks, const float* vbase, int64_t vs,
                const float* mask, int64_t ms, int64_t keys, int64_t padded, int64_t group, int64_t chunks_,
                float sc, float* scores, float* out) {
  const int64_t chunks = CHUNKS ? CHUNKS : chunks_;
  const int64_t d = 8 * chunks;
  for (int64_t g = 0; g < group; ++g) {
    const float* qv = qbase + g * qh;
    float* row = scores + g * padded;
    v8 q[CHUNKS ? CHUNKS : 32];
    for (int64_t c = 0; c < chunks; ++c) q[c] = load8(qv + 8 * c);
    float top = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) {
      const float* kr = kbase + j * ks;
      v8 dot = q[0] * load8(kr);
      for (int64_t c = 1; c < chunks; ++c) dot += q[c] * load8(kr + 8 * c);
      const float s = hsum8(dot) * sc + mask[j * ms];
      row[j] = s;
      top = s > top ? s : top;
    }
    TORCH_CHECK(top > -INFINITY, "a row attends to no slot");
    for (int64_t j = keys; j < padded; ++j) row[j] = -INFINITY;
    v8 total{};
    for (int64_t j = 0; j < padded; j += 8) {
      const v8 p = exp8_nonpositive(load8(row + j) - top);
      store8(row + j, p);
      total += p;
    }
    const float inv = 1.0f / hsum8(total);
    v8 acc[CHUNKS ? CHUNKS : 32];
    for (int64_t c = 0; c < chunks; ++c) acc[c] = v8{};
    for (int64_t j = 0; j < keys; ++j) {
      const float* vr = vbase + j * vs;
      const float p = row[j] * inv;
      for (int64_t c = 0; c < chunks; ++c) acc[c] += p * load8(vr + 8 * c);
    }
    for (int64_t c = 0; c < chunks; ++c) store8(out + g * d + 8 * c, acc[c]);
  }
}

}  // namespace

// softmax(q k^T * scale + additive) v for one query per row: query [b, heads, 1, d], key and value
// [b, kv heads, >= keys, d] (the first `keys` slots are read), additive [b, 1, 1, >= keys]. Returns
// [b, 1, heads, d]. d must be a multiple of 8 (at most kMaxHeadDim) and every row must attend to at least one slot.
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const torch::Tensor& additive, int64_t keys, double scale) {
  for (const auto* t : {&query, &key, &value, &additive}) check_fp32_cpu(*t, "attention inputs");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && additive.dim() == 4, "4-d inputs expected");
  const int64_t b = query.size(0), heads = query.size(1), d = query.size(3), kv_heads = key.size(1);
  TORCH_CHECK(query.size(2) == 1, "one query per row");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv heads");
  TORCH_CHECK(d > 0 && d % 8 == 0 && d <= kMaxHeadDim && key.size(3) == d && value.size(3) == d,
              "head dim must be a multiple of 8, at most ", kMaxHeadDim);
  TORCH_CHECK(key.size(0) == b && value.size(0) == b && value.size(1) == kv_heads, "key/value shape mismatch");
  TORCH_CHECK(keys > 0 && keys <= key.size(2) && keys <= value.size(2) && keys <= additive.size(3), "keys out of range");
  TORCH_CHECK(additive.size(0) == b && additive.size(1) == 1 && additive.size(2) == 1, "additive must be [b, 1, 1, s]");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1, "head dim must be contiguous");
  const int64_t group = heads / kv_heads;
  auto out = torch::empty({b, 1, heads, d}, query.options());
  const float* pq = query.data_ptr<float>();
  const float* pk = key.data_ptr<float>();
  const float* pv = value.data_ptr<float>();
  const float* pm = additive.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int64_t qb = query.stride(0), qh = query.stride(1);
  const int64_t kb = key.stride(0), kh = key.stride(1), ks = key.stride(2);
  const int64_t vb = value.stride(0), vh = value.stride(1), vs = value.stride(2);
  const int64_t mb = additive.stride(0), ms = additive.stride(3);
  const float sc = static_cast<float>(scale);
  const int64_t padded = (keys + 7) / 8 * 8;
  const int64_t chunks = d / 8;
  // A (row, KV head) is ~keys * d * (2 * group + 1) flops; split only what is worth a thread's wake-up.
  const int64_t grain = std::max<int64_t>(1, 16384 / (keys * d * group));
  at::parallel_for(0, b * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * padded);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / kv_heads, h = item % kv_heads;
      const float* qbase = pq + i * qb + h * group * qh;
      const float* kbase = pk + i * kb + h * kh;
      const float* vbase = pv + i * vb + h * vh;
      const float* mask = pm + i * mb;
      float* dst = po + (i * heads + h * group) * d;
      switch (chunks) {
        case 8:
          attend_one<8>(qbase, qh, kbase, ks, vbase, vs, mask, ms, keys, padded, group, chunks, sc, scores.data(), dst);
          break;
        case 16:
          attend_one<16>(qbase, qh, kbase, ks, vbase, vs, mask, ms, keys, padded, group, chunks, sc, scores.data(), dst);
          break;
        default:
          attend_one<0>(qbase, qh, kbase, ks, vbase, vs, mask, ms, keys, padded, group, chunks, sc, scores.data(), dst);
      }
    }
  });
  return out;
}

// A static KV cache's update for new tokens: key/value [b, kv heads, n, d] (any strides but the last) into
// keys/values [b, kv heads, slots, d] (contiguous) at slots cumulative_length .. + n, then
// cumulative_length += n (transformers' StaticLayer.update without its arange, add and two index_copy_).
void write_slots(torch::Tensor& keys, torch::Tensor& values, const torch::Tensor& key, const torch::Tensor& value,
                 torch::Tensor& cumulative_length) {
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&keys, &values, &key, &value})
    check_fp32_cpu(*t, "cache tensors");
  TORCH_CHECK(cumulative_length.device().is_cpu() && cumulative_length.scalar_type() == torch::kInt64 &&
                  cumulative_length.numel() == 1,
              "cumulative_length must be one int64 on the CPU");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() && keys.dim() == 4,
              "the cache must be two contiguous [b, kv heads, slots, d] tensors");
  TORCH_CHECK(key.sizes() == value.sizes() && key.dim() == 4 && key.size(0) == keys.size(0) &&
                  key.size(1) == keys.size(1) && key.size(3) == keys.size(3),
              "new keys and values must be [b, kv heads, n, d] like the cache");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "head dim must be contiguous");
  const int64_t b = keys.size(0), heads = keys.size(1), slots = keys.size(2), d = keys.size(3), n = key.size(2);
  int64_t* length = cumulative_length.data_ptr<int64_t>();
  const int64_t start = *length;
  TORCH_CHECK(start >= 0 && start + n <= slots, "the cache has ", slots, " slots; writing ", n, " at ", start);
  const size_t bytes = d * sizeof(float);
  for (const auto& [dst, src] : {std::pair<torch::Tensor*, const torch::Tensor*>{&keys, &key}, {&values, &value}}) {
    float* out = dst->data_ptr<float>();
    const float* in = src->data_ptr<float>();
    for (int64_t i = 0; i < b; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < n; ++t)
          std::memcpy(out + ((i * heads + h) * slots + start + t) * d,
                      in + i * src->stride(0) + h * src->stride(1) + t * src->stride(2), bytes);
  }
  *length = start + n;
}

namespace {

// oneDNN's product on a reordered weight, `torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")`,
// through the dispatcher as the Python call goes (packed_linear.onednn_linear).
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, const c10::IValue& bias) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  static const c10::IValue none(std::string("none"));
  torch::jit::Stack stack{x, packed, bias, none, c10::IValue(c10::List<std::optional<c10::Scalar>>()), c10::IValue()};
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

// The same product with `residual` added as oneDNN writes it (`_linear_pointwise.binary`, "add"): the same
// rounding as `residual + product`.
torch::Tensor packed_linear_add(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& packed,
                                const c10::IValue& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "binary");
  static const c10::IValue add(std::string("add"));
  torch::jit::Stack stack{x, residual, packed, bias, add};
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

c10::IValue optional_tensor(const std::optional<torch::Tensor>& t) { return t ? c10::IValue(*t) : c10::IValue(); }

}  // namespace

// One decode step of a Llama-layout decoder layer over a static cache: fused_layer.fused_step's operations,
// in its order, called from here instead of from Python (there, a dozen calls per layer and step, each with
// its argument conversions). The weights are the layer's packed products; the step calls the kernels above
// and oneDNN's products, so its result is fused_step's to the bit.
class LayerStep {
 public:
  LayerStep(torch::Tensor input_norm, double input_eps, torch::Tensor qkv, std::optional<torch::Tensor> qkv_bias,
            torch::Tensor o, std::optional<torch::Tensor> o_bias, torch::Tensor post_norm, double post_eps,
            torch::Tensor gate_up, std::optional<torch::Tensor> gate_up_bias, torch::Tensor down,
            std::optional<torch::Tensor> down_bias, int64_t heads, int64_t kv_heads, int64_t head_dim,
            int64_t intermediate, double scale)
      : input_norm_(std::move(input_norm)),
        post_norm_(std::move(post_norm)),
        qkv_(std::move(qkv)),
        o_(std::move(o)),
        gate_up_(std::move(gate_up)),
        down_(std::move(down)),
        qkv_bias_(optional_tensor(qkv_bias)),
        o_bias_(optional_tensor(o_bias)),
        gate_up_bias_(optional_tensor(gate_up_bias)),
        down_bias_(optional_tensor(down_bias)),
        input_eps_(input_eps),
        post_eps_(post_eps),
        scale_(scale),
        heads_(heads),
        kv_heads_(kv_heads),
        d_(head_dim),
        intermediate_(intermediate) {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv heads");
    TORCH_CHECK(head_dim > 0 && head_dim % 8 == 0 && head_dim <= kMaxHeadDim, "head dim must be a multiple of 8, at most ",
                kMaxHeadDim);
  }

  // hidden [b, 1, hidden]; cos, sin [b or 1, 1, d]; keys, values [b, kv heads, slots, d], the cache layer's,
  // written at cumulative_length (advanced by one); additive [b, 1, 1, >= slots], the mask as floats, and
  // `attended`, how many leading slots any row attends to. Returns the layer's output [b, 1, hidden].
  torch::Tensor operator()(const torch::Tensor& hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                           torch::Tensor& keys, torch::Tensor& values, torch::Tensor& cumulative_length,
                           const torch::Tensor& additive, int64_t attended) const {
    check_fp32_cpu(hidden, "hidden states");
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(1) == 1, "one token per row: hidden states [b, 1, hidden]");
    const int64_t rows = hidden.size(0), d = d_, q_width = heads_ * d, k_width = kv_heads_ * d;
    const auto x = rms_norm(hidden, input_norm_, input_eps_);
    const auto qkv = packed_linear(x, qkv_, qkv_bias_);
    TORCH_CHECK(qkv.size(-1) == q_width + 2 * k_width, "the packed q/k/v product is ", qkv.size(-1), " wide, not ",
                q_width + 2 * k_width);
    const auto q = qkv.narrow(-1, 0, q_width).view({rows, 1, heads_, d}).transpose(1, 2);
    const auto k = qkv.narrow(-1, q_width, k_width).view({rows, 1, kv_heads_, d}).transpose(1, 2);
    const auto v = qkv.narrow(-1, q_width + k_width, k_width).view({rows, 1, kv_heads_, d}).transpose(1, 2);
    const auto rotated = rotary(q, k, cos.expand({rows, 1, d}), sin.expand({rows, 1, d}));
    write_slots(keys, values, rotated[1], v, cumulative_length);
    const auto attention =
        decode_attention(rotated[0], keys, values, additive, std::min<int64_t>(attended, keys.size(2)), scale_);
    const auto mid = packed_linear_add(attention.reshape({rows, 1, q_width}), hidden, o_, o_bias_);
    const auto gate_up = packed_linear(rms_norm(mid, post_norm_, post_eps_), gate_up_, gate_up_bias_);
    const auto gated =
        at::silu(gate_up.narrow(-1, 0, intermediate_)).mul_(gate_up.narrow(-1, intermediate_, intermediate_));
    return packed_linear_add(gated, mid, down_, down_bias_);
  }

 private:
  torch::Tensor input_norm_, post_norm_, qkv_, o_, gate_up_, down_;
  c10::IValue qkv_bias_, o_bias_, gate_up_bias_, down_bias_;
  double input_eps_, post_eps_, scale_;
  int64_t heads_, kv_heads_, d_, intermediate_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("MAX_HEAD_DIM") = kMaxHeadDim;
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension");
  m.def("rotary", &rotary, "transformers' apply_rotary_pos_emb");
  m.def("decode_attention", &decode_attention, "one-query-per-row attention");
  m.def("write_slots", &write_slots, "a static cache layer's update");
  py::class_<LayerStep>(m, "LayerStep", "a Llama-layout decoder layer's decode step over a static cache")
      .def(py::init<torch::Tensor, double, torch::Tensor, std::optional<torch::Tensor>, torch::Tensor,
                    std::optional<torch::Tensor>, torch::Tensor, double, torch::Tensor, std::optional<torch::Tensor>,
                    torch::Tensor, std::optional<torch::Tensor>, int64_t, int64_t, int64_t, int64_t, double>())
      .def("__call__", &LayerStep::operator());
}
