#include "headroom/interop/onnx_export.h"

#include "headroom/interop/onnx_proto.h"  // first: it fixes the ONNX namespace

#include <ATen/ATen.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <typeindex>
#include <unordered_map>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/models/anchors.h"
#include "headroom/models/layers.h"

namespace headroom::interop {

using namespace models;

namespace {

constexpr int64_t kOpset = 17;

// Appends nodes and initializers to a graph; every value gets a fresh name.
class Graph {
 public:
  Graph(onnx::GraphProto& g, bool half) : g_(g), half_(half) {}
  bool half() const { return half_; }

  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& in, int outputs = 1,
                                const std::function<void(onnx::NodeProto&)>& attrs = {}) {
    onnx::NodeProto* n = g_.add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(g_.node_size()));
    for (const auto& i : in) n->add_input(i);
    std::vector<std::string> out;
    for (int k = 0; k < outputs; ++k) {
      out.push_back(n->name() + (outputs > 1 ? ":" + std::to_string(k) : ""));
      n->add_output(out.back());
    }
    if (attrs) attrs(*n);
    return out;
  }
  std::string op(const std::string& type, const std::vector<std::string>& in, const std::function<void(onnx::NodeProto&)>& attrs = {}) {
    return node(type, in, 1, attrs)[0];
  }

  // A weight or constant: floating tensors in the graph's precision, integers as int64.
  std::string tensor(const at::Tensor& t, const std::string& hint, bool keep_float = false) {
    onnx::TensorProto* p = g_.add_initializer();
    p->set_name(hint + "_" + std::to_string(g_.initializer_size()));
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    if (c.is_floating_point()) {
      c = c.to(half_ && !keep_float ? at::kHalf : at::kFloat);
      p->set_data_type(c.scalar_type() == at::kHalf ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT);
    } else {
      c = c.to(at::kLong);
      p->set_data_type(onnx::TensorProto::INT64);
    }
    for (int64_t d : c.sizes()) p->add_dims(d);
    p->set_raw_data(c.data_ptr(), c.nbytes());  // little-endian, as ONNX stores raw data
    return p->name();
  }
  std::string ints(const std::vector<int64_t>& v) { return tensor(at::tensor(v, at::kLong), "shape"); }
  std::string scalar(double v) { return tensor(at::scalar_tensor(v, at::kFloat), "const"); }

 private:
  onnx::GraphProto& g_;
  bool half_;
};

void set(onnx::NodeProto& n, const char* name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void set(onnx::NodeProto& n, const char* name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void set(onnx::NodeProto& n, const char* name, const std::string& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

// Writes modules as nodes: one function per module class, found by type (a registry), each
// the mirror of that module's forward.
class Emitter {
 public:
  Emitter(Graph& g, bool dynamic) : g(g), dynamic(dynamic) {}
  Graph& g;
  const bool dynamic;  // symbolic batch, height and width: the head computes its grids from the features' shapes

  std::string module(torch::nn::Module& m, const std::string& x);

  std::string sequence(torch::nn::Module& seq, std::string x) {
    for (const auto& c : seq.children()) x = module(*c, x);
    return x;
  }
  std::string conv_bn(ConvBnImpl& m, const std::string& x) {
    if (m.bn) throw Error("ONNX export: a BatchNorm was not folded into its convolution");
    const ConvBnOptions& o = m.options;
    const int64_t pad = o.padding() >= 0 ? o.padding() : o.dilation() * (o.kernel() - 1) / 2;
    std::vector<std::string> in = {x, g.tensor(m.conv->weight, "w")};
    if (m.conv->bias.defined()) in.push_back(g.tensor(m.conv->bias, "b"));
    return g.op("Conv", in, [&](onnx::NodeProto& n) {
      set(n, "kernel_shape", std::vector<int64_t>{o.kernel(), o.kernel()});
      set(n, "strides", std::vector<int64_t>{o.stride(), o.stride()});
      set(n, "pads", std::vector<int64_t>{pad, pad, pad, pad});
      set(n, "dilations", std::vector<int64_t>{o.dilation(), o.dilation()});
      set(n, "group", o.groups());
    });
  }
  std::string silu(const std::string& x) { return g.op("Mul", {x, g.op("Sigmoid", {x})}); }
  std::string relu(const std::string& x) { return g.op("Relu", {x}); }
  std::string add(const std::string& a, const std::string& b) { return g.op("Add", {a, b}); }
  std::string concat(const std::vector<std::string>& xs, int64_t axis) {
    return g.op("Concat", xs, [&](onnx::NodeProto& n) { set(n, "axis", axis); });
  }
  std::vector<std::string> split(const std::string& x, int64_t axis, const std::vector<int64_t>& sizes) {
    return g.node("Split", {x, g.ints(sizes)}, int(sizes.size()), [&](onnx::NodeProto& n) { set(n, "axis", axis); });
  }
  std::string slice(const std::string& x, int64_t axis, int64_t begin, int64_t end) {
    return g.op("Slice", {x, g.ints({begin}), g.ints({end}), g.ints({axis})});
  }
  std::string reshape(const std::string& x, const std::vector<int64_t>& shape) { return g.op("Reshape", {x, g.ints(shape)}); }
  std::string transpose(const std::string& x, const std::vector<int64_t>& perm) {
    return g.op("Transpose", {x}, [&](onnx::NodeProto& n) { set(n, "perm", perm); });
  }
  std::string max_pool(const std::string& x, int64_t k) {
    return g.op("MaxPool", {x}, [&](onnx::NodeProto& n) {
      set(n, "kernel_shape", std::vector<int64_t>{k, k});
      set(n, "strides", std::vector<int64_t>{1, 1});
      set(n, "pads", std::vector<int64_t>{k / 2, k / 2, k / 2, k / 2});
    });
  }
  // Nearest upsampling as PyTorch's: source index = floor(destination / scale).
  std::string upsample(const std::string& x, double scale) {
    const std::string scales = g.tensor(at::tensor({1.0f, 1.0f, float(scale), float(scale)}), "scales", /*keep_float=*/true);
    return g.op("Resize", {x, "", scales}, [&](onnx::NodeProto& n) {
      set(n, "mode", std::string("nearest"));
      set(n, "coordinate_transformation_mode", std::string("asymmetric"));
      set(n, "nearest_mode", std::string("floor"));
    });
  }

  // AreaAttentionImpl::forward's mirror: [B, C, H, W] -> same.
  std::string area_attention(AreaAttentionImpl& m, const std::string& x) {
    const int64_t hd = m.head_dim;
    const std::string flat = transpose(reshape(module(*m.qkv, x), {0, 3 * m.heads * hd, -1}), {0, 2, 1});  // [B, N, 3C]
    const std::string t = transpose(reshape(flat, {0, m.area, -1, m.heads, 3 * hd}), {0, 1, 3, 4, 2});  // [B, area, heads, 3 hd, n]
    const std::vector<std::string> s = split(t, 3, {hd, hd, hd});  // q, k, v
    const std::string q = g.op("Mul", {s[0], g.scalar(std::pow(double(hd), -0.5))});
    const std::string attn = g.op("Softmax", {g.op("MatMul", {transpose(q, {0, 1, 2, 4, 3}), s[1]})},
                                  [](onnx::NodeProto& n) { set(n, "axis", int64_t(-1)); });
    const std::string shape = g.op("Shape", {x});
    const auto to_map = [&](const std::string& y) {  // [B, area, heads, hd, n] -> [B, C, H, W]
      return g.op("Reshape", {transpose(reshape(transpose(y, {0, 1, 4, 2, 3}), {0, -1, m.heads * hd}), {0, 2, 1}), shape});
    };
    const std::string y = to_map(g.op("MatMul", {s[2], transpose(attn, {0, 1, 2, 4, 3})}));
    return module(*m.proj, add(y, module(*m.pe, to_map(s[2]))));
  }

  std::string hourglass_level(HourglassLevelImpl& m, const std::string& x) {
    const std::string up = sequence(*m.up1, x), l1 = sequence(*m.low1, x);
    const std::string l2 = m.low2 ? hourglass_level(*m.low2, l1) : sequence(*m.low2_blocks, l1);
    return add(up, upsample(sequence(*m.low3, l2), 2.0));
  }
  std::vector<std::string> hourglass(HourglassImpl& m, std::string inter) {
    std::vector<std::string> outs;
    for (size_t s = 0; s < m.kps.size(); ++s) {
      const std::string cnv = module(*m.cnvs[s], hourglass_level(*m.kps[s], inter));
      outs.push_back(cnv);
      if (s + 1 < m.kps.size())
        inter = module(*m.inters[s], relu(add(conv_bn(*m.inters_[s], inter), conv_bn(*m.cnvs_[s], cnv))));
    }
    return outs;
  }
};

using ModuleEmitter = std::function<std::string(Emitter&, torch::nn::Module&, const std::string&)>;

template <class T>
std::pair<std::type_index, ModuleEmitter> emitter(std::function<std::string(Emitter&, T&, const std::string&)> f) {
  return {std::type_index(typeid(T)), [f](Emitter& e, torch::nn::Module& m, const std::string& x) { return f(e, dynamic_cast<T&>(m), x); }};
}

const std::unordered_map<std::type_index, ModuleEmitter>& emitters() {
  static const std::unordered_map<std::type_index, ModuleEmitter> registry = {
      emitter<ConvBnImpl>([](Emitter& e, ConvBnImpl& m, const std::string& x) { return e.conv_bn(m, x); }),
      emitter<ConvImpl>([](Emitter& e, ConvImpl& m, const std::string& x) {
        const std::string y = e.conv_bn(*m.cb, x);
        return m.act ? e.silu(y) : y;
      }),
      emitter<torch::nn::SequentialImpl>([](Emitter& e, torch::nn::SequentialImpl& m, const std::string& x) { return e.sequence(m, x); }),
      emitter<ConvPairImpl>([](Emitter& e, ConvPairImpl& m, const std::string& x) { return e.module(*m.second, e.module(*m.first, x)); }),
      emitter<BottleneckImpl>([](Emitter& e, BottleneckImpl& m, const std::string& x) {
        const std::string y = e.module(*m.cv2, e.module(*m.cv1, x));
        return m.add ? e.add(x, y) : y;
      }),
      emitter<C3Impl>([](Emitter& e, C3Impl& m, const std::string& x) {
        return e.module(*m.cv3, e.concat({e.sequence(*m.m, e.module(*m.cv1, x)), e.module(*m.cv2, x)}, 1));
      }),
      emitter<C2fImpl>([](Emitter& e, C2fImpl& m, const std::string& x) {
        std::vector<std::string> y = e.split(e.module(*m.cv1, x), 1, {m.c, m.c});
        for (const auto& b : *m.m) y.push_back(e.module(*b, y.back()));
        return e.module(*m.cv2, e.concat(y, 1));
      }),
      emitter<SPPFImpl>([](Emitter& e, SPPFImpl& m, const std::string& x) {
        std::vector<std::string> y = {e.module(*m.cv1, x)};
        for (int64_t i = 0; i < m.options.n(); ++i) y.push_back(e.max_pool(y.back(), m.options.k()));
        const std::string out = e.module(*m.cv2, e.concat(y, 1));
        return m.add ? e.add(out, x) : out;
      }),
      emitter<SPPImpl>([](Emitter& e, SPPImpl& m, const std::string& x) {
        const std::string y = e.module(*m.cv1, x);
        std::vector<std::string> parts = {y};
        for (int64_t k : m.ks) parts.push_back(e.max_pool(y, k));
        return e.module(*m.cv2, e.concat(parts, 1));
      }),
      emitter<AttentionImpl>([](Emitter& e, AttentionImpl& m, const std::string& x) {
        const std::string qkv = e.reshape(e.module(*m.qkv, x), {0, m.heads, 2 * m.key_dim + m.head_dim, -1});
        const std::vector<std::string> s = e.split(qkv, 2, {m.key_dim, m.key_dim, m.head_dim});  // q, k, v
        const std::string scores = e.g.op("Mul", {e.g.op("MatMul", {e.transpose(s[0], {0, 1, 3, 2}), s[1]}), e.g.scalar(m.scale)});
        const std::string attn = e.g.op("Softmax", {scores}, [](onnx::NodeProto& n) { set(n, "axis", int64_t(-1)); });
        const std::string shape = e.g.op("Shape", {x});
        const std::string y = e.g.op("Reshape", {e.g.op("MatMul", {s[2], e.transpose(attn, {0, 1, 3, 2})}), shape});
        return e.module(*m.proj, e.add(y, e.module(*m.pe, e.g.op("Reshape", {s[2], shape}))));
      }),
      emitter<PSABlockImpl>([](Emitter& e, PSABlockImpl& m, const std::string& x) {
        const std::string y = e.add(x, e.module(*m.attn, x));
        return e.add(y, e.sequence(*m.ffn, y));
      }),
      emitter<C2PSAImpl>([](Emitter& e, C2PSAImpl& m, const std::string& x) {
        const std::vector<std::string> ab = e.split(e.module(*m.cv1, x), 1, {m.c, m.c});
        return e.module(*m.cv2, e.concat({ab[0], e.sequence(*m.m, ab[1])}, 1));
      }),
      emitter<AreaAttentionImpl>([](Emitter& e, AreaAttentionImpl& m, const std::string& x) { return e.area_attention(m, x); }),
      emitter<ABlockImpl>([](Emitter& e, ABlockImpl& m, const std::string& x) {
        const std::string y = e.add(x, e.module(*m.attn, x));
        return e.add(y, e.sequence(*m.mlp, y));
      }),
      emitter<A2C2fImpl>([](Emitter& e, A2C2fImpl& m, const std::string& x) {
        std::vector<std::string> y = {e.module(*m.cv1, x)};
        for (const auto& b : *m.m) y.push_back(e.module(*b, y.back()));
        const std::string out = e.module(*m.cv2, e.concat(y, 1));
        return m.gamma.defined() ? e.add(x, e.g.op("Mul", {e.g.tensor(m.gamma.view({1, -1, 1, 1}), "gamma"), out})) : out;
      }),
      emitter<HgConvImpl>([](Emitter& e, HgConvImpl& m, const std::string& x) { return e.relu(e.conv_bn(*m.cb, x)); }),
      emitter<ResidualImpl>([](Emitter& e, ResidualImpl& m, const std::string& x) {
        const std::string y = e.conv_bn(*m.conv2, e.relu(e.conv_bn(*m.conv1, x)));
        return e.relu(e.add(y, m.skip ? e.conv_bn(*m.skip, x) : x));
      }),
      emitter<HourglassStemImpl>([](Emitter& e, HourglassStemImpl& m, const std::string& x) {
        return e.module(*m.res, e.module(*m.conv, x));
      }),
  };
  return registry;
}

std::string Emitter::module(torch::nn::Module& m, const std::string& x) {
  const auto it = emitters().find(std::type_index(typeid(m)));
  if (it == emitters().end()) throw Error("ONNX export: no writer for module " + m.name());
  return it->second(*this, m, x);
}

// Rows: their inputs to their outputs (Hourglass: one per stack), by layer type.
using RowEmitter = std::function<std::vector<std::string>(Emitter&, LayerImpl&, const std::vector<std::string>&)>;

template <class T>
std::pair<std::type_index, RowEmitter> row_emitter(std::function<std::vector<std::string>(Emitter&, T&, const std::vector<std::string>&)> f) {
  return {std::type_index(typeid(T)), [f](Emitter& e, LayerImpl& l, const std::vector<std::string>& in) { return f(e, dynamic_cast<T&>(l), in); }};
}

std::vector<std::string> emit_row(Emitter& e, LayerImpl& layer, const std::vector<std::string>& in) {
  static const std::unordered_map<std::type_index, RowEmitter> registry = {
      row_emitter<SequentialLayerImpl>([](Emitter& e, SequentialLayerImpl& l, const std::vector<std::string>& in) {
        return std::vector<std::string>{e.sequence(*l.seq, in.at(0))};
      }),
      row_emitter<ConcatLayerImpl>([](Emitter& e, ConcatLayerImpl& l, const std::vector<std::string>& in) {
        return std::vector<std::string>{e.concat(in, l.dim())};
      }),
      row_emitter<UpsampleLayerImpl>([](Emitter& e, UpsampleLayerImpl& l, const std::vector<std::string>& in) {
        return std::vector<std::string>{e.upsample(in.at(0), l.scale())};
      }),
      row_emitter<HourglassImpl>([](Emitter& e, HourglassImpl& l, const std::vector<std::string>& in) { return e.hourglass(l, in.at(0)); }),
  };
  const auto it = registry.find(std::type_index(typeid(layer)));
  if (it == registry.end()) throw Error("ONNX export: no writer for layer " + layer.name());
  return it->second(e, layer, in);
}

// A feature map's cells, from its shape in the graph (a symbolic height and width): [1, 2, H*W],
// x then y of each cell in row-major order, plus `offset`, in the graph's float type.
std::string cell_grid(Emitter& e, const std::string& feature, double offset) {
  Graph& g = e.g;
  const std::string shape = g.op("Shape", {feature}), zero = g.tensor(at::scalar_tensor(0, at::kLong), "index");
  const auto coordinates = [&](int64_t dim, int64_t axis) {  // [1, W] or [H, 1]: 0, 1, ... + offset
    const std::string n = g.op("Gather", {shape, g.tensor(at::scalar_tensor(dim, at::kLong), "index")});
    const std::string r = g.op("Range", {zero, n, g.tensor(at::scalar_tensor(1, at::kLong), "index")});
    const std::string f = g.op("Cast", {r}, [&](onnx::NodeProto& p) {
      set(p, "to", int64_t(g.half() ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT));
    });
    return g.op("Unsqueeze", {e.add(f, g.scalar(offset)), g.ints({axis})});
  };
  const std::string hw = e.slice(shape, 0, 2, 4);
  const std::string x = g.op("Expand", {coordinates(3, 0), hw}), y = g.op("Expand", {coordinates(2, 1), hw});  // [H, W]
  return e.concat({e.reshape(x, {1, 1, -1}), e.reshape(y, {1, 1, -1})}, 1);
}

// [1, 2, A] anchor points and [1, 1, A] strides, as decode_candidates uses: constants at the
// export size, or computed from the features' shapes when height and width are symbolic.
std::pair<std::string, std::string> anchor_grid(Emitter& e, const std::vector<std::string>& f, const std::vector<at::Tensor>& feats,
                                                const std::vector<int64_t>& strides) {
  if (!e.dynamic) {
    const models::AnchorGrid grid = models::make_anchor_grid(feats, strides, 0.5);  // points [A, 2], strides [A, 1]
    return {e.g.tensor(grid.points.t().unsqueeze(0), "anchors"), e.g.tensor(grid.strides.t().unsqueeze(0), "strides")};
  }
  std::vector<std::string> points, level_strides;
  for (size_t i = 0; i < f.size(); ++i) {
    points.push_back(cell_grid(e, f[i], 0.5));
    const std::string one = e.g.op("Shape", {e.slice(points.back(), 1, 0, 1)});  // [1, 1, H*W]
    level_strides.push_back(e.g.op("Expand", {e.g.tensor(at::full({1, 1, 1}, double(strides[i])), "strides"), one}));
  }
  return {e.concat(points, 2), e.concat(level_strides, 2)};
}

// An end-to-end head's detections [B, k, 6] (x1, y1, x2, y2, score, class), k = min(max_det,
// anchors), as topk_detections picks them: the k anchors with the best class score, then the k
// best (anchor, class) pairs among them. boxes [B, 4, A] xyxy pixels, scores [B, nc, A].
std::string emit_topk_detections(Emitter& e, const std::string& boxes, const std::string& scores, int64_t nc, int64_t anchors,
                                 int64_t max_det) {
  Graph& g = e.g;
  const std::string k = e.dynamic ? g.op("Min", {g.ints({max_det}), e.slice(g.op("Shape", {scores}), 0, 2, 3)})
                                  : g.ints({std::min(max_det, anchors)});
  const auto topk = [&](const std::string& x) {  // along axis 1, best first: {values, indices}
    std::vector<std::string> out = g.node("TopK", {x, k}, 2, [](onnx::NodeProto& n) { set(n, "axis", int64_t(1)); });
    return std::pair(out[0], out[1]);
  };
  const auto gather_rows = [&](const std::string& x, const std::string& index, int64_t width) {  // x [B, A, width], index [B, k]
    const std::string shape = e.concat({g.op("Shape", {index}), g.ints({width})}, 0);
    return g.op("GatherElements", {x, g.op("Expand", {g.op("Unsqueeze", {index, g.ints({2})}), shape})},
                [](onnx::NodeProto& n) { set(n, "axis", int64_t(1)); });
  };
  const std::string per_anchor = e.transpose(scores, {0, 2, 1});  // [B, A, nc]
  const std::string best = g.op("ReduceMax", {per_anchor}, [](onnx::NodeProto& n) {  // opset 17: axes an attribute
    set(n, "axes", std::vector<int64_t>{2});
    set(n, "keepdims", int64_t(0));
  });
  const std::string first = topk(best).second;                                                  // [B, k] anchors
  const auto [top, pair] = topk(e.reshape(gather_rows(per_anchor, first, nc), {0, -1}));        // of k x nc
  const std::string c = g.ints({nc});
  const std::string anchor = g.op("GatherElements", {first, g.op("Div", {pair, c})}, [](onnx::NodeProto& n) { set(n, "axis", int64_t(1)); });
  const std::string cls = g.op("Cast", {g.op("Mod", {pair, c})}, [&](onnx::NodeProto& n) {
    set(n, "to", int64_t(g.half() ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT));
  });
  const std::string picked = gather_rows(e.transpose(boxes, {0, 2, 1}), anchor, 4);  // [B, k, 4]
  return e.concat({picked, g.op("Unsqueeze", {top, g.ints({2})}), g.op("Unsqueeze", {cls, g.ints({2})})}, 2);
}

// YOLOv8 / YOLO11 / YOLO26: distances (the DFL expectation, or YOLO26's raw outputs) to a box
// and sigmoid classes; per anchor [B, 4 + nc, A] centre-size boxes, or an end-to-end head's
// one-to-one detections [B, k, 6] with no NMS left to run (`end2end`; else its one-to-many branch
// per anchor).
std::string emit_detect_v8(Emitter& e, DetectV8Impl& d, const std::vector<std::string>& f, const std::vector<at::Tensor>& feats,
                           const std::vector<int64_t>& strides, int64_t max_det, bool end2end) {
  const int64_t reg_max = d.reg_max(), nc = d.nc(), no = 4 * reg_max + nc;
  torch::nn::ModuleList boxes_of = end2end ? d.one2one_cv2 : d.cv2, classes_of = end2end ? d.one2one_cv3 : d.cv3;
  std::vector<std::string> levels;
  for (size_t i = 0; i < f.size(); ++i)
    levels.push_back(e.reshape(e.concat({e.module(*boxes_of[i], f[i]), e.module(*classes_of[i], f[i])}, 1), {0, no, -1}));
  const std::vector<std::string> parts = e.split(e.concat(levels, 2), 1, {4 * reg_max, nc});  // [B, 4 reg_max, A], [B, nc, A]
  std::string dist = parts[0];  // [B, 4, A] l, t, r, b
  if (reg_max > 1) {
    const std::string probs = e.g.op("Softmax", {e.reshape(parts[0], {0, 4, reg_max, -1})},
                                     [](onnx::NodeProto& n) { set(n, "axis", int64_t(2)); });
    const std::string bins = e.g.tensor(d.dfl->weight.view({1, 1, reg_max, 1}), "dfl");
    dist = e.g.op("ReduceSum", {e.g.op("Mul", {probs, bins}), e.g.ints({2})}, [](onnx::NodeProto& n) { set(n, "keepdims", int64_t(0)); });
  }
  const auto [p, s] = anchor_grid(e, f, feats, strides);
  const std::string x1y1 = e.g.op("Sub", {p, e.slice(dist, 1, 0, 2)}), x2y2 = e.add(p, e.slice(dist, 1, 2, 4));
  const std::string scores = e.g.op("Sigmoid", {parts[1]});
  if (end2end) {
    int64_t anchors = 0;
    for (const auto& t : feats) anchors += t.size(2) * t.size(3);
    return emit_topk_detections(e, e.g.op("Mul", {e.concat({x1y1, x2y2}, 1), s}), scores, nc, anchors, max_det);
  }
  const std::string centre = e.g.op("Mul", {e.add(x1y1, x2y2), e.g.scalar(0.5)}), size = e.g.op("Sub", {x2y2, x1y1});
  return e.concat({e.g.op("Mul", {e.concat({centre, size}, 1), s}), scores}, 1);
}

// YOLOv5: per level sigmoid, grid offsets and anchor sizes, objectness x class.
std::string emit_detect_v5(Emitter& e, DetectV5Impl& d, const std::vector<std::string>& f, const std::vector<at::Tensor>& feats,
                           const std::vector<int64_t>& strides) {
  const int64_t na = d.anchors_per_cell(), no = d.nc() + 5;
  std::vector<std::string> levels;
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string raw = e.conv_bn(*d.m[i]->as<ConvBnImpl>(), f[i]);  // [B, na * no, H, W]
    const std::string y = e.g.op("Sigmoid", {e.reshape(e.transpose(e.reshape(raw, {0, na, no, -1}), {0, 2, 1, 3}), {0, no, -1})});
    // per anchor column (a, h, w): cell x, y and the anchor's w, h in pixels
    const at::Tensor sizes = d.anchors()[int64_t(i)].to(at::kFloat).t();  // [2, na]
    std::string cell, anchor;  // [1, 2, na*H*W]
    if (e.dynamic) {
      const std::string grid = cell_grid(e, f[i], 0.0);  // [1, 2, H*W]
      cell = e.g.op("Tile", {grid, e.g.ints({1, 1, na})});
      const std::string shape = e.concat({e.g.ints({1, 2, na}), e.slice(e.g.op("Shape", {grid}), 0, 2, 3)}, 0);
      anchor = e.reshape(e.g.op("Expand", {e.g.tensor(sizes.view({1, 2, na, 1}), "anchor_sizes"), shape}), {1, 2, -1});
    } else {
      const int64_t H = feats[i].size(2), W = feats[i].size(3);
      const auto grid = at::meshgrid({at::arange(H, at::kFloat), at::arange(W, at::kFloat)}, "ij");
      cell = e.g.tensor(at::stack({grid[1].flatten(), grid[0].flatten()}).repeat({1, na}).unsqueeze(0), "cells");
      anchor = e.g.tensor(sizes.repeat_interleave(H * W, 1).unsqueeze(0), "anchor_sizes");
    }
    const std::string two = e.g.scalar(2.0);
    const std::string xy = e.g.op("Mul", {e.add(e.g.op("Sub", {e.g.op("Mul", {e.slice(y, 1, 0, 2), two}), e.g.scalar(0.5)}), cell),
                                           e.g.scalar(double(strides[i]))});
    const std::string wh2 = e.g.op("Mul", {e.slice(y, 1, 2, 4), two});
    const std::string wh = e.g.op("Mul", {e.g.op("Mul", {wh2, wh2}), anchor});
    const std::string scores = e.g.op("Mul", {e.slice(y, 1, 5, no), e.slice(y, 1, 4, 5)});
    levels.push_back(e.concat({xy, wh, scores}, 1));
  }
  return e.concat(levels, 2);
}

// An input or output; with --dynamic the dimensions named in `symbolic` ("" = fixed) are symbolic.
void add_io(onnx::ValueInfoProto* v, const std::string& name, bool half, const std::vector<int64_t>& dims, bool dynamic,
            const std::vector<std::string>& symbolic) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(half ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT);
  for (size_t i = 0; i < dims.size(); ++i) {
    auto* d = t->mutable_shape()->add_dim();
    if (dynamic && !symbolic[i].empty())
      d->set_dim_param(symbolic[i]);
    else
      d->set_dim_value(dims[i]);
  }
}

// Rejects a batch or input size the graph cannot be built for.
void check_export_options(const DetectorInfo& di, const OnnxExportOptions& o) {
  if (o.batch() < 1) throw InputError("export: --batch must be at least 1");
  if (o.max_det() < 1) throw InputError("export: --max-det must be at least 1");
  if (o.imgsz() <= 0 || o.imgsz() % di.input_multiple != 0 || o.imgsz() > 8192)  // data.imgsz's range
    throw InputError("export: --imgsz " + std::to_string(o.imgsz()) + " must be a positive multiple of " + std::to_string(di.input_multiple) +
                     ", at most 8192");
}

// Opset, producer and an empty graph named after the model.
void init_model_proto(onnx::ModelProto& m, const std::string& graph_name) {
  m.set_ir_version(8);
  m.set_producer_name("headroom");
  m.set_producer_version(HEADROOM_VERSION);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  m.mutable_graph()->set_name(graph_name);
}

// The graph input `images` with the model's input normalisation applied; returns the value the body reads.
std::string emit_input_norm(Graph& g, const InputNorm& n) {
  std::string image = "images";
  if (n.empty()) return image;
  // as DetectorImpl::forward: x * (255 / std) - mean / std
  if (n.bgr) image = g.op("Gather", {image, g.ints({2, 1, 0})}, [](onnx::NodeProto& p) { set(p, "axis", int64_t{1}); });
  std::vector<float> scale(3), shift(3);
  for (size_t c = 0; c < 3; ++c) scale[c] = float(255.0 / n.std[c]), shift[c] = float(n.mean[c] / n.std[c]);
  image = g.op("Mul", {image, g.tensor(at::tensor(scale).view({1, 3, 1, 1}), "input_scale")});
  image = g.op("Sub", {image, g.tensor(at::tensor(shift).view({1, 3, 1, 1}), "input_shift")});
  return image;
}

// The body's rows in order, each fed the outputs of the rows it reads from (-1: the image); returns the head's inputs.
std::vector<std::string> emit_rows(Emitter& e, const DetectorImpl& model, const std::string& image) {
  std::vector<std::vector<std::string>> values;
  const auto gather = [&](const std::vector<int>& from) {
    std::vector<std::string> in;
    for (int j : from) {
      if (j < 0)
        in.push_back(image);
      else
        in.insert(in.end(), values[size_t(j)].begin(), values[size_t(j)].end());
    }
    return in;
  };
  for (const auto& row : model.rows()) values.push_back(emit_row(e, *row.layer, gather(row.from)));
  return gather(model.head_from());
}

using NamedOutputs = std::vector<std::pair<std::string, std::string>>;  // {graph value, output name}

// The head's outputs: {graph value, output name}, by head type.
NamedOutputs emit_head(Emitter& e, DetectorImpl& model, const std::vector<std::string>& features, const HeadOutputs& probe,
                       int64_t max_det, bool end2end) {
  const DetectorInfo& di = model.info();
  using HeadEmitter = std::function<NamedOutputs(Emitter&, HeadImpl&)>;
  const auto yolo = [&](auto emit) -> HeadEmitter {
    return [&, emit](Emitter& em, HeadImpl& h) { return NamedOutputs{{emit(em, h, features, probe.at("pred"), di.strides), "output0"}}; };
  };
  const std::unordered_map<std::type_index, HeadEmitter> heads = {
      {std::type_index(typeid(DetectV8Impl)),
       yolo([max_det, end2end](Emitter& em, HeadImpl& h, const std::vector<std::string>& f, const std::vector<at::Tensor>& p,
                               const std::vector<int64_t>& s) {
         return emit_detect_v8(em, dynamic_cast<DetectV8Impl&>(h), f, p, s, max_det, end2end);
       })},
      {std::type_index(typeid(DetectV5Impl)),
       yolo([](Emitter& em, HeadImpl& h, const std::vector<std::string>& f, const std::vector<at::Tensor>& p, const std::vector<int64_t>& s) {
         return emit_detect_v5(em, dynamic_cast<DetectV5Impl&>(h), f, p, s);
       })},
      {std::type_index(typeid(CenterNetHeadImpl)),
       [&](Emitter& em, HeadImpl& h) {
         NamedOutputs out;
         for (const auto& [name, stacks] : dynamic_cast<CenterNetHeadImpl&>(h).heads()) {  // the last stack, as inference uses
           torch::nn::ModuleList list = stacks;
           const std::string y = em.module(*list[list->size() - 1], features.back());
           out.emplace_back(name == "heatmap" ? em.g.op("Sigmoid", {y}) : y, name);
         }
         return out;
       }},
  };
  HeadImpl& head = model.head();
  const auto emit_head = heads.find(std::type_index(typeid(head)));
  if (emit_head == heads.end()) throw Error("ONNX export: no writer for this head");
  return emit_head->second(e, head);
}

// Rename the last node's output to the public name.
void rename_output(onnx::GraphProto& gp, const std::string& value, const std::string& name) {
  for (int i = gp.node_size() - 1; i >= 0; --i) {
    auto* n = gp.mutable_node(i);
    bool found = false;
    for (int k = 0; k < n->output_size(); ++k)
      if (n->output(k) == value) {
        n->set_output(k, name);
        found = true;
      }
    if (found) break;
  }
}

// An output's shape for batch B, read off the probe forward at the export size.
std::vector<int64_t> output_dims(const DetectorInfo& di, const HeadOutputs& probe, const std::string& name, int64_t B, int64_t max_det) {
  if (di.family == "centernet") {
    const at::Tensor& t = probe.at(name).back();
    return {B, t.size(1), t.size(2), t.size(3)};
  }
  int64_t a = 0;
  for (const auto& p : probe.at("pred")) a += di.family == "yolov5" ? p.size(1) * p.size(2) * p.size(3) : p.size(2) * p.size(3);
  if (di.end2end) return {B, std::min(max_det, a), 6};
  return {B, 4 + di.nc, a};
}

// The class names as a Python dict literal, as Ultralytics writes it.
std::string names_dict_literal(const std::vector<std::string>& class_names) {
  std::string names = "{";
  for (size_t i = 0; i < class_names.size(); ++i) {
    std::string quoted;
    for (char ch : class_names[i]) quoted += ch == '\'' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
    names += (i ? ", " : "") + std::to_string(i) + ": '" + quoted + "'";
  }
  names += "}";
  return names;
}

void add_metadata(onnx::ModelProto& m, const DetectorInfo& di, const WeightsInfo& info, int64_t B, const OnnxExportOptions& o) {
  const int64_t imgsz = o.imgsz();
  // Ultralytics' runtimes read `dynamic` from args: without it they split a batch into the export's.
  const auto py = [](bool b) { return std::string(b ? "True" : "False"); };
  const std::string args = "{'batch': " + std::to_string(B) + ", 'dynamic': " + py(o.dynamic()) + ", 'half': " + py(o.half()) +
                           ", 'imgsz': " + std::to_string(imgsz) + ", 'nms': False}";
  // Ultralytics' runtimes pad an image to a multiple of `stride`: the input's multiple (a
  // CenterNet Hourglass needs 128, its output stride being 4), the largest stride for a YOLO.
  const int64_t stride = std::max(di.input_multiple, *std::max_element(di.strides.begin(), di.strides.end()));
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"description", "Headroom " + m.graph().name() + " (" + di.family + " head)"},
           {"author", "Headroom"},
           {"version", HEADROOM_VERSION},
           {"task", "detect"},
           {"stride", std::to_string(stride)},
           {"batch", std::to_string(B)},
           {"imgsz", "[" + std::to_string(imgsz) + ", " + std::to_string(imgsz) + "]"},
           {"names", names_dict_literal(info.names)},
           {"args", args},
           {"channels", "3"},
           {"end2end", di.end2end ? "True" : "False"},
           {"family", di.family}}) {
    auto* p = m.add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
}

// The ONNX checker, then strict shape inference (which also records the inferred shapes in m).
void check_graph(onnx::ModelProto& m) {
  try {
    onnx::checker::check_model(m);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), onnx::ShapeInferenceOptions(true, 1));
  } catch (const std::exception& ex) {
    throw Error("ONNX export: the graph fails the ONNX checker: " + std::string(ex.what()));
  }
}

}  // namespace

void export_onnx(DetectorImpl& model, const WeightsInfo& info, const std::string& path, const OnnxExportOptions& o) {
  DetectorInfo di = model.info();
  di.end2end = di.end2end && o.end2end();  // the graph's outputs, shapes and metadata follow the branch written
  check_export_options(di, o);
  at::NoGradGuard no_grad;
  model.to(at::kCPU, at::kFloat);
  model.eval();
  model.fuse();
  model.set_recompute(RecomputeMode::off);
  // The head's feature sizes at the export size (anchor constants, reshapes).
  const HeadOutputs probe = model.forward(at::zeros({1, 3, o.imgsz(), o.imgsz()}));

  onnx::ModelProto m;
  init_model_proto(m, model.name());
  onnx::GraphProto& gp = *m.mutable_graph();
  Graph g(gp, o.half());
  Emitter e(g, o.dynamic());
  const int64_t B = o.dynamic() ? 1 : o.batch();
  add_io(gp.add_input(), "images", o.half(), {B, 3, o.imgsz(), o.imgsz()}, o.dynamic(), {"batch", "", "height", "width"});
  const std::string image = emit_input_norm(g, model.input_norm());
  const std::vector<std::string> features = emit_rows(e, model, image);
  for (const auto& [value, name] : emit_head(e, model, features, probe, o.max_det(), di.end2end)) {
    rename_output(gp, value, name);
    const std::vector<std::string> symbolic = di.family == "centernet" ? std::vector<std::string>{"batch", "", "out_height", "out_width"}
                                              : di.end2end               ? std::vector<std::string>{"batch", "detections", ""}
                                                                         : std::vector<std::string>{"batch", "", "anchors"};
    add_io(gp.add_output(), name, o.half(), output_dims(di, probe, name, B, o.max_det()), o.dynamic(), symbolic);
  }
  add_metadata(m, di, info, B, o);
  check_graph(m);
  write_file_atomic(path, m.SerializeAsString());
}

}  // namespace headroom::interop
