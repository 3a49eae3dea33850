// The pickle machine behind read_torch_file: the opcodes pickle protocols 0-4 emit, with the
// callables torch.save uses to rebuild tensors.
#include "torch_file_internal.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "headroom/core/text.h"

namespace headroom::interop {

namespace {

using Kind = PyValue::Kind;

PyRef make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}
PyRef make_int(int64_t i) {
  PyRef v = make(Kind::integer);
  v->integer = i;
  return v;
}
PyRef make_text(Kind k, std::string s) {
  PyRef v = make(k);
  v->text = std::move(s);
  return v;
}
PyRef make_tensor(at::Tensor t) {
  PyRef v = make(Kind::tensor);
  v->tensor = std::move(t);
  return v;
}

// The storage classes torch.save names ("torch.HalfStorage") and their element types.
at::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat},   {"torch.DoubleStorage", at::kDouble}, {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16}, {"torch.LongStorage", at::kLong}, {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},   {"torch.CharStorage", at::kChar},     {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool},     {"torch.UntypedStorage", at::kByte},  {"torch.storage.UntypedStorage", at::kByte}};
  const auto it = types.find(name);
  if (it == types.end()) throw std::runtime_error("a storage of type " + name + ", which this reader does not read");
  return it->second;
}

class Unpickler {
 public:
  Unpickler(const char* data, size_t size, StorageLoader storages) : p_(data), begin_(data), end_(data + size), storages_(std::move(storages)) {}

  PyRef run() {
    for (;;) {
      const uint8_t op = u8();
      if (op == '.') {  // STOP
        if (stack_.empty()) fail("STOP on an empty stack");
        return stack_.back();
      }
      step(op);
    }
  }
  size_t consumed() const { return size_t(p_ - begin_); }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("pickle byte " + std::to_string(p_ - begin_) + ": " + why);
  }
  // Protocol 0's numbers are text: a damaged one is named with its byte, not std::stoll's word.
  int64_t text_int(const std::string& s) const {
    if (const auto v = parse_int(s)) return *v;
    fail("'" + s + "' is not an integer (a damaged file?)");
  }
  double text_real(const std::string& s) const {
    if (const auto v = parse_double(s)) return *v;
    fail("'" + s + "' is not a number (a damaged file?)");
  }
  uint64_t text_index(const std::string& s) const {
    const int64_t v = text_int(s);
    if (v < 0) fail("a negative memo index");
    return uint64_t(v);
  }
  void need(size_t n) const {
    if (size_t(end_ - p_) < n) fail("the pickle ends early (truncated file?)");
  }
  uint8_t u8() {
    need(1);
    return uint8_t(*p_++);
  }
  template <class T>
  T little() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string bytes(size_t n) {
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::string line() {
    const char* nl = static_cast<const char*>(std::memchr(p_, '\n', size_t(end_ - p_)));
    if (!nl) fail("a text argument without its end of line");
    std::string s(p_, size_t(nl - p_));
    p_ = nl + 1;
    return s;
  }

  PyRef pop() {
    if (stack_.empty()) fail("pop from an empty stack");
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyRef& top() {
    if (stack_.empty()) fail("an empty stack");
    return stack_.back();
  }
  std::vector<PyRef> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail("a MARK above the stack");
    std::vector<PyRef> items(stack_.begin() + long(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  // Records that `parent` holds `child`, bounding what a few bytes of opcodes can make: nesting
  // deeper than 1000 would overflow the stack where the values are walked or freed, and shared
  // values nested in each other (a tuple of x and x, of that and that, ...) make a walk visit
  // 2^levels values. A container is filled before it is placed in another (torch.save writes
  // no recursive structures), so the depth and count of every holder stay true.
  void adopt(PyValue& parent, PyValue& child) {
    if (&parent == &child) fail("a value that contains itself");
    if (parent.adopted) fail("a value changed after it was placed in another (a recursive structure, which torch.save does not write)");
    child.adopted = true;
    parent.depth = std::max(parent.depth, child.depth + 1);
    if (parent.depth > 1000) fail("values nested more than 1000 deep (a damaged file?)");
    parent.nodes += child.nodes;
    if (parent.nodes > 10'000'000) fail("more than 10^7 values once shared ones are counted where they appear (a damaged file?)");
  }
  PyRef tuple(std::vector<PyRef> items) {
    PyRef t = make(Kind::tuple);
    for (const auto& i : items) adopt(*t, *i);
    t->items = std::move(items);
    return t;
  }
  PyRef list(std::vector<PyRef> items) {
    PyRef l = make(Kind::list);
    for (const auto& i : items) adopt(*l, *i);
    l->items = std::move(items);
    return l;
  }
  PyRef object(const std::string& cls, const PyRef& args) {
    PyRef o = make_text(Kind::object, cls);
    adopt(*o, *args);
    o->args = args;
    return o;
  }
  PyRef memo_get(uint64_t i) {
    const auto it = memo_.find(i);
    if (it == memo_.end()) fail("memo " + std::to_string(i) + " was never stored");
    return it->second;
  }
  // LONG1/LONG4: two's complement, little-endian. Wider than 64 bits (the legacy format's magic
  // number) stays its bytes.
  static PyRef little_long(const std::string& b) {
    if (b.size() > 8) return make_text(Kind::bytes, b);
    uint64_t v = 0;
    for (size_t i = 0; i < b.size(); ++i) v |= uint64_t(uint8_t(b[i])) << (8 * i);
    if (!b.empty() && b.size() < 8 && (uint8_t(b.back()) & 0x80)) v |= ~uint64_t(0) << (8 * b.size());
    return make_int(int64_t(v));
  }
  void set_items(PyValue& target, const std::vector<PyRef>& kv) {
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    if (target.kind != Kind::dict && target.kind != Kind::object) fail("SETITEMS on a " + target.describe());
    for (size_t i = 0; i < kv.size(); i += 2) {
      adopt(target, *kv[i]);
      adopt(target, *kv[i + 1]);
      target.entries.emplace_back(kv[i], kv[i + 1]);
    }
  }
  void append(PyValue& target, const std::vector<PyRef>& v) {
    if (target.kind != Kind::list && target.kind != Kind::object) fail("APPEND on a " + target.describe());
    for (const auto& x : v) adopt(target, *x);
    target.items.insert(target.items.end(), v.begin(), v.end());
  }

  static const PyValue& arg(const PyValue& args, size_t i) {
    if (args.kind != Kind::tuple || i >= args.items.size()) throw std::runtime_error("a call with too few arguments");
    return *args.items[i];
  }
  static std::vector<int64_t> ints(const PyValue& v) {
    std::vector<int64_t> out;
    for (const auto& x : v.items) {
      if (x->kind != Kind::integer) throw std::runtime_error("a tensor size or stride that is not an integer");
      out.push_back(x->integer);
    }
    return out;
  }

  // REDUCE: the callables torch.save uses to rebuild tensors and ordered dicts (a registry by
  // name); anything else becomes an object named after its callable.
  using Callable = PyRef (*)(Unpickler&, const PyRef& args);
  static const std::map<std::string, Callable>& callables() {
    static const std::map<std::string, Callable> registry = [] {
      std::map<std::string, Callable> r;
      for (const char* f : {"torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor"}) r[f] = &Unpickler::rebuild_tensor;
      for (const char* f : {"torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state"})
        r[f] = [](Unpickler& u, const PyRef& args) {
          const PyValue& data = arg(*args, 0);
          if (data.kind != Kind::tensor) u.fail("a parameter without a tensor");
          return make_tensor(data.tensor);
        };
      for (const char* f : {"collections.OrderedDict", "builtins.dict"})
        r[f] = [](Unpickler& u, const PyRef& args) {
          PyRef d = make(Kind::dict);
          if (args->kind == Kind::tuple && !args->items.empty())  // OrderedDict([(k, v), ...])
            for (const auto& kv : args->items[0]->items)
              if (kv->items.size() == 2) u.set_items(*d, {kv->items[0], kv->items[1]});
          return d;
        };
      for (const char* f : {"builtins.set", "builtins.frozenset", "__builtin__.set"})
        r[f] = [](Unpickler& u, const PyRef& args) {
          return u.list(args->kind == Kind::tuple && !args->items.empty() ? args->items[0]->items : std::vector<PyRef>{});
        };
      r["copyreg._reconstructor"] = [](Unpickler& u, const PyRef& args) {
        return u.object(args->kind == Kind::tuple && !args->items.empty() ? args->items[0]->text : "", args);
      };
      for (const char* f : {"torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_sparse_csr_tensor",
                            "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_wrapper_subclass",
                            "torch.storage._load_from_bytes"})
        r[f] = [](Unpickler& u, const PyRef&) -> PyRef {
          u.fail("it holds a tensor stored in a way this reader does not read (quantized, sparse, meta or a subclass; save a plain dense state_dict)");
        };
      return r;
    }();
    return registry;
  }

  PyRef call(const PyValue& callable, const PyRef& args) {
    const auto it = callables().find(callable.text);
    if (it != callables().end()) return it->second(*this, args);
    return object(callable.text, args);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, ...): a view of the storage, checked to lie
  // inside it before LibTorch is asked for it.
  static PyRef rebuild_tensor(Unpickler& u, const PyRef& args) {
    const PyValue& storage = arg(*args, 0);
    if (storage.kind != Kind::tensor) u.fail("a tensor rebuilt from something other than a storage");
    const int64_t offset = arg(*args, 1).integer;
    const std::vector<int64_t> size = ints(arg(*args, 2)), stride = ints(arg(*args, 3));
    if (size.size() != stride.size() || offset < 0) u.fail("a tensor whose sizes and strides disagree");
    int64_t last = offset;  // the last element's index
    bool empty = false;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) u.fail("a tensor with a negative size or stride");
      if (size[i] == 0) empty = true;
      int64_t reach = 0;
      if (size[i] > 0 && (__builtin_mul_overflow(size[i] - 1, stride[i], &reach) || __builtin_add_overflow(last, reach, &last)))
        u.fail("a tensor whose extent overflows");
    }
    if (!empty && last >= storage.tensor.numel()) u.fail("a tensor reaches past the end of its storage");
    return make_tensor(storage.tensor.as_strided(size, stride, offset));
  }

  // ('storage', storage_type, key, location, numel[, view_metadata])
  PyRef persistent(const PyRef& pid) {
    if (pid->kind != Kind::tuple || pid->items.size() < 5 || pid->items[0]->text != "storage")
      fail("a persistent id that is not a storage: " + pid->describe());
    if (pid->items.size() > 5 && !pid->items[5]->is_none()) fail("a storage view (PyTorch before 1.0), which this reader does not read");
    const at::ScalarType dtype = storage_dtype(pid->items[1]->text);
    const PyValue& key = *pid->items[2];
    const std::string k = key.kind == Kind::integer ? std::to_string(key.integer) : key.text;
    const auto it = storages_cache_.find(k);
    if (it != storages_cache_.end()) return it->second;
    const PyValue& numel = *pid->items[4];
    PyRef t = make_tensor(storages_(k, dtype, numel.kind == Kind::integer ? numel.integer : -1));
    storages_cache_[k] = t;
    return t;
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: u8(); break;                  // PROTO
      case 0x95: little<uint64_t>(); break;    // FRAME: frames are read as one stream
      case '(': marks_.push_back(stack_.size()); break;
      case '0': pop(); break;
      case '1': pop_to_mark(); break;
      case '2': stack_.push_back(top()); break;
      case 'N': stack_.push_back(make(Kind::none)); break;
      case 0x88:
      case 0x89: {
        PyRef b = make(Kind::boolean);
        b->boolean = op == 0x88;
        stack_.push_back(b);
        break;
      }
      case 'I': {  // INT: text; "01"/"00" are protocol 0's booleans
        const std::string s = line();
        if (s == "01" || s == "00") {
          PyRef b = make(Kind::boolean);
          b->boolean = s == "01";
          stack_.push_back(b);
        } else {
          stack_.push_back(make_int(text_int(s)));
        }
        break;
      }
      case 'L': {
        std::string s = line();
        if (!s.empty() && s.back() == 'L') s.pop_back();
        stack_.push_back(make_int(text_int(s)));
        break;
      }
      case 'J': stack_.push_back(make_int(little<int32_t>())); break;
      case 'K': stack_.push_back(make_int(u8())); break;
      case 'M': stack_.push_back(make_int(little<uint16_t>())); break;
      case 0x8a: stack_.push_back(little_long(bytes(u8()))); break;
      case 0x8b: {
        const int32_t n = little<int32_t>();
        if (n < 0) fail("a negative length");
        stack_.push_back(little_long(bytes(size_t(n))));
        break;
      }
      case 'F': {
        PyRef v = make(Kind::real);
        v->real = text_real(line());
        stack_.push_back(v);
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | uint8_t(p_[i]);
        p_ += 8;
        PyRef v = make(Kind::real);
        std::memcpy(&v->real, &bits, 8);
        stack_.push_back(v);
        break;
      }
      case 'S': {  // STRING: a quoted repr; torch.save never writes escapes into the names we read
        std::string s = line();
        if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"')) s = s.substr(1, s.size() - 2);
        stack_.push_back(make_text(Kind::string, s));
        break;
      }
      case 'V': stack_.push_back(make_text(Kind::string, line())); break;
      case 'T': stack_.push_back(make_text(Kind::string, bytes(little<uint32_t>()))); break;
      case 'U': stack_.push_back(make_text(Kind::string, bytes(u8()))); break;
      case 'X': stack_.push_back(make_text(Kind::string, bytes(little<uint32_t>()))); break;
      case 0x8c: stack_.push_back(make_text(Kind::string, bytes(u8()))); break;
      case 0x8d: stack_.push_back(make_text(Kind::string, bytes(size_t(little<uint64_t>())))); break;
      case 'B': stack_.push_back(make_text(Kind::bytes, bytes(little<uint32_t>()))); break;
      case 'C': stack_.push_back(make_text(Kind::bytes, bytes(u8()))); break;
      case 0x8e: stack_.push_back(make_text(Kind::bytes, bytes(size_t(little<uint64_t>())))); break;
      case ']': stack_.push_back(make(Kind::list)); break;
      case 'l': stack_.push_back(list(pop_to_mark())); break;
      case 'a': {
        PyRef v = pop();
        append(*top(), {v});
        break;
      }
      case 'e': {
        std::vector<PyRef> v = pop_to_mark();
        append(*top(), v);
        break;
      }
      case ')': stack_.push_back(tuple({})); break;
      case 't': stack_.push_back(tuple(pop_to_mark())); break;
      case 0x85:
      case 0x86:
      case 0x87: {
        const size_t n = size_t(op - 0x84);
        if (stack_.size() < n) fail("TUPLE on a short stack");
        std::vector<PyRef> items(stack_.end() - long(n), stack_.end());
        stack_.resize(stack_.size() - n);
        stack_.push_back(tuple(std::move(items)));
        break;
      }
      case '}': stack_.push_back(make(Kind::dict)); break;
      case 'd': {
        PyRef d = make(Kind::dict);
        set_items(*d, pop_to_mark());
        stack_.push_back(d);
        break;
      }
      case 's': {
        PyRef v = pop(), k = pop();
        set_items(*top(), {k, v});
        break;
      }
      case 'u': {
        std::vector<PyRef> kv = pop_to_mark();
        set_items(*top(), kv);
        break;
      }
      case 0x8f: stack_.push_back(make(Kind::list)); break;  // EMPTY_SET: a set reads as a list
      case 0x90: {  // ADDITEMS
        std::vector<PyRef> v = pop_to_mark();
        append(*top(), v);
        break;
      }
      case 0x91: stack_.push_back(list(pop_to_mark())); break;  // FROZENSET
      case 'p': memo_[text_index(line())] = top(); break;
      case 'q': memo_[u8()] = top(); break;
      case 'r': memo_[little<uint32_t>()] = top(); break;
      case 0x94: memo_[memo_.size()] = top(); break;
      case 'g': stack_.push_back(memo_get(text_index(line()))); break;
      case 'h': stack_.push_back(memo_get(u8())); break;
      case 'j': stack_.push_back(memo_get(little<uint32_t>())); break;
      case 'c': {
        const std::string module = line(), name = line();
        stack_.push_back(make_text(Kind::global, module + "." + name));
        break;
      }
      case 0x93: {
        PyRef name = pop(), module = pop();
        stack_.push_back(make_text(Kind::global, module->text + "." + name->text));
        break;
      }
      case 'R': {
        PyRef args = pop(), callable = pop();
        stack_.push_back(call(*callable, args));
        break;
      }
      case 0x81: {  // NEWOBJ
        PyRef args = pop(), cls = pop();
        stack_.push_back(object(cls->text, args));
        break;
      }
      case 0x92: {  // NEWOBJ_EX
        pop();  // kwargs
        PyRef args = pop(), cls = pop();
        stack_.push_back(object(cls->text, args));
        break;
      }
      case 'o': {  // OBJ: MARK cls args... OBJ
        std::vector<PyRef> v = pop_to_mark();
        if (v.empty()) fail("OBJ without a class");
        stack_.push_back(object(v[0]->text, tuple(std::vector<PyRef>(v.begin() + 1, v.end()))));
        break;
      }
      case 'i': {  // INST: module and name lines, MARK args
        const std::string module = line(), name = line();
        stack_.push_back(object(module + "." + name, tuple(pop_to_mark())));
        break;
      }
      case 'b': {  // BUILD
        PyRef state = pop();
        PyValue& obj = *top();
        if (obj.kind == Kind::object) {  // a dict's attributes (OrderedDict._metadata) are dropped
          adopt(obj, *state);
          obj.state = state;
        }
        break;
      }
      case 'Q': {
        PyRef pid = pop();
        stack_.push_back(persistent(pid));
        break;
      }
      case 'P': fail("a text persistent id (PERSID), which torch.save does not write");
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("opcode ") + hex + ", which torch.save does not write (not a torch file, or damaged)");
      }
    }
  }

  const char* p_;
  const char* begin_;
  const char* end_;
  StorageLoader storages_;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_cache_;
};

}  // namespace

PyRef unpickle(const char* data, size_t size, StorageLoader storages, size_t* consumed) {
  Unpickler u(data, size, std::move(storages));
  PyRef v = u.run();
  if (consumed) *consumed = u.consumed();
  return v;
}

}  // namespace headroom::interop
