// gdn._gdn: the op on DLPack tensors (torch, numpy, ...), CPU or CUDA by where q lives. The
// Python package (gdn/ops.py) allocates outputs and workspaces and calls these; every argument
// check is the library's (gdn::Error, raised as ValueError naming the argument).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gdn/communicator.h"
#include "gdn/context_parallel.h"
#include "gdn/delta_rule.h"
#include "gdn/error.h"
#ifdef GDN_PYTHON_CUDA
#include "gdn/cuda.h"
#include "gdn/gpu_communicator.h"
#endif

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::c_contig>;
using Optional = std::optional<Array>;

gdn::DType dtype_of(const Array& a, const char* name) {
  const nb::dlpack::dtype t = a.dtype();
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == static_cast<std::uint8_t>(Code::Float) && t.bits == 64) return gdn::DType::f64;
    if (t.code == static_cast<std::uint8_t>(Code::Float) && t.bits == 32) return gdn::DType::f32;
    if (t.code == static_cast<std::uint8_t>(Code::Float) && t.bits == 16) return gdn::DType::f16;
    if (t.code == static_cast<std::uint8_t>(Code::Bfloat) && t.bits == 16) return gdn::DType::bf16;
    if (t.code == static_cast<std::uint8_t>(Code::Int) && t.bits == 64) return gdn::DType::i64;
    if (t.code == static_cast<std::uint8_t>(Code::Int) && t.bits == 32) return gdn::DType::i32;
  }
  throw gdn::Error(std::string(name) +
                   ": unsupported dtype (expected f64, f32, f16, bf16, i64 or i32)");
}

gdn::TensorRef ref(const Array& a, const char* name) {
  gdn::TensorRef t;
  t.data = a.data();
  t.dtype = dtype_of(a, name);
  for (std::size_t i = 0; i < a.ndim(); ++i)
    t.shape.push_back(static_cast<std::int64_t>(a.shape(i)));
  if (t.data == nullptr && t.numel() == 0) t.data = reinterpret_cast<void*>(std::uintptr_t{256});
  return t;
}

gdn::TensorRef ref(const Optional& a, const char* name) {
  return a ? ref(*a, name) : gdn::TensorRef{};
}

// Where the op runs: every tensor on q's device.
bool on_cuda(const Array& q,
             std::initializer_list<std::pair<const Optional*, const char*>> others) {
  const bool cuda = q.device_type() == nb::device::cuda::value;
  if (!cuda && q.device_type() != nb::device::cpu::value)
    throw gdn::Error("q: the op runs on the CPU or a CUDA GPU, got another device");
  for (const auto& [t, name] : others)
    if (*t && ((*t)->device_type() != q.device_type() || (*t)->device_id() != q.device_id()))
      throw gdn::Error(std::string(name) + " must be on q's device");
  return cuda;
}

gdn::DeltaRuleInputs inputs(const Array& q, const Array& k, const Array& v, const Array& g,
                            const Array& beta, const Optional& initial_state,
                            const Optional& cu_seqlens, double scale, bool use_qk_l2norm) {
  gdn::DeltaRuleInputs in;
  in.q = ref(q, "q");
  in.k = ref(k, "k");
  in.v = ref(v, "v");
  in.g = ref(g, "g");
  in.beta = ref(beta, "beta");
  in.initial_state = ref(initial_state, "initial_state");
  in.cu_seqlens = ref(cu_seqlens, "cu_seqlens");
  in.scale = scale;
  in.use_qk_l2norm = use_qk_l2norm;
  return in;
}

gdn::Method method_of(const std::string& name) {
  if (name == "chunked") return gdn::Method::chunked;
  if (name == "recurrent") return gdn::Method::recurrent;
  throw gdn::Error("method must be \"chunked\" or \"recurrent\", got \"" + name + "\"");
}

#ifdef GDN_PYTHON_CUDA
// save: a forward that keeps its intermediates for the backward, or a backward that reads them
// from forward_workspace.
gdn::CudaContext context(std::uintptr_t stream, const Optional& workspace,
                         const Optional& cu_seqlens_host, bool save,
                         const Optional& forward_workspace) {
  gdn::CudaContext ctx;
  ctx.stream = reinterpret_cast<CUstream_st*>(stream);
  if (workspace) {
    ctx.workspace = workspace->data();
    ctx.workspace_bytes = workspace->nbytes();
  }
  ctx.cu_seqlens_host = ref(cu_seqlens_host, "cu_seqlens_host");
  ctx.save_for_backward = save;
  if (forward_workspace) {
    ctx.forward_workspace = forward_workspace->data();
    ctx.forward_workspace_bytes = forward_workspace->nbytes();
  }
  return ctx;
}

gdn::DType dtype_named(const std::string& name) {
  for (gdn::DType d : {gdn::DType::f32, gdn::DType::bf16, gdn::DType::f16})
    if (gdn::dtype_name(d) == name) return d;
  throw gdn::Error("dtype must be f32, bf16 or f16, got \"" + name + "\"");
}
#endif

[[noreturn, maybe_unused]] void no_cuda() {
  throw gdn::Error("q is on a CUDA device but gdn was built without CUDA");
}

// A communicator as Python holds it: owned (NCCL), or lent by run_virtual_ranks for the length of
// the rank's function, after which every use is an error instead of a dangling reference.
struct CommState {
  gdn::Communicator* comm = nullptr;
  std::unique_ptr<gdn::Communicator> owned;
};

class Comm {
 public:
  explicit Comm(std::shared_ptr<CommState> state) : state_(std::move(state)) {}

  gdn::Communicator& get() const {
    if (state_->comm == nullptr)
      throw gdn::Error("this communicator belonged to a run_virtual_ranks call that has returned");
    return *state_->comm;
  }
  const std::shared_ptr<CommState>& state() const { return state_; }

  // Every buffer in the communicator's memory: host arrays for host communicators, CUDA arrays
  // on its device for device ones.
  void check(const Array& a, const char* name) const {
    const bool device = get().memory() == gdn::Memory::device;
    const bool cuda = a.device_type() == nb::device::cuda::value;
    if (device != cuda || (!cuda && a.device_type() != nb::device::cpu::value))
      throw gdn::Error(std::string(name) + ": the communicator's buffers live on the " +
                       (device ? "GPU" : "CPU") + ", got a tensor on another device");
  }

 private:
  std::shared_ptr<CommState> state_;
};

gdn::Timeout timeout_of(double seconds) {
  if (!(seconds > 0))
    throw gdn::Error("timeout must be a positive number of seconds, got " +
                     std::to_string(seconds));
  return gdn::Timeout(static_cast<std::int64_t>(seconds * 1000));
}

// One rank's side of the context-parallel op, on the communicator's memory.
class CpOp {
 public:
  CpOp(const Comm& comm, const std::string& strategy, bool save_for_backward)
      : comm_(comm.state()) {
    gdn::CpOptions options;
    options.strategy =
        strategy == "auto" ? gdn::Strategy::automatic : gdn::parse_strategy(strategy);
    options.save_for_backward = save_for_backward;
    gdn::Communicator& c = comm.get();
    if (c.memory() == gdn::Memory::host) {
      op_ = std::make_unique<gdn::CpDeltaRule>(c, options);
      return;
    }
#ifdef GDN_PYTHON_CUDA
    op_ = gdn::cuda_cp_delta_rule(c, options);
#else
    no_cuda();
#endif
  }

  void forward(const gdn::DeltaRuleInputs& in, const gdn::DeltaRuleOutputs& out) {
    Comm(comm_).get();
    nb::gil_scoped_release release;
    op_->forward(in, out);
  }
  void backward(const gdn::DeltaRuleInputs& in, const gdn::DeltaRuleGrads& grads) {
    Comm(comm_).get();
    nb::gil_scoped_release release;
    op_->backward(in, grads);
  }
  std::string strategy() const {
    return std::string(gdn::strategy_name(op_->strategy()));
  }

 private:
  std::shared_ptr<CommState> comm_;
  std::unique_ptr<gdn::CpDeltaRule> op_;
};

// Runs fn(Comm) on `ranks` threads, each holding the GIL only while it runs Python; the library's
// calls release it, so ranks wait for each other in C++.
nb::list run_virtual_ranks(int ranks, const std::string& device, nb::callable fn, double timeout) {
  std::vector<nb::object> results(ranks > 0 ? ranks : 0);
  const auto rank_body = [&](gdn::Communicator& c) {
    auto state = std::make_shared<CommState>();
    state->comm = &c;
    nb::gil_scoped_acquire gil;
    try {
      results[c.rank()] = fn(Comm(state));
      state->comm = nullptr;
    } catch (const nb::python_error& e) {
      state->comm = nullptr;
      (void)e.what();  // formats the message while this thread holds the GIL
      throw;
    } catch (...) {
      state->comm = nullptr;
      throw;
    }
  };
  const gdn::Timeout limit = timeout_of(timeout);
  {
    nb::gil_scoped_release release;
    if (device == "cpu") {
      gdn::run_in_process(ranks, rank_body, limit);
    } else if (device == "cuda") {
#ifdef GDN_PYTHON_CUDA
      gdn::run_on_one_gpu(ranks, rank_body, limit);
#else
      throw gdn::Error("device \"cuda\": gdn was built without CUDA");
#endif
    } else {
      throw gdn::Error("device must be \"cpu\" or \"cuda\", got \"" + device + "\"");
    }
  }
  nb::list out;
  for (nb::object& r : results) out.append(r);
  return out;
}

}  // namespace

NB_MODULE(_gdn, m) {
  m.doc() = "The gated delta rule (gdn) on DLPack tensors: the low-level calls of gdn.ops.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gdn::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
#ifdef GDN_PYTHON_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  m.def(
      "workspace_bytes",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
         const Optional& initial_state, const Optional& cu_seqlens, const Optional& cu_seqlens_host,
         bool backward, bool save) -> std::size_t {
        const gdn::DeltaRuleInputs in =
            inputs(q, k, v, g, beta, initial_state, cu_seqlens, 0, false);
        if (!on_cuda(q, {{&initial_state, "initial_state"}, {&cu_seqlens, "cu_seqlens"}})) return 0;
#ifdef GDN_PYTHON_CUDA
        const gdn::TensorRef host = ref(cu_seqlens_host, "cu_seqlens_host");
        return backward ? gdn::delta_rule_backward_cuda_workspace(in, host, save, save)
                        : gdn::delta_rule_forward_cuda_workspace(in, host, save);
#else
        (void)cu_seqlens_host, (void)backward, (void)save;
        no_cuda();
#endif
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
      nb::arg("cu_seqlens_host").none(), nb::arg("backward"), nb::arg("save"),
      "Device workspace bytes of a forward or backward on CUDA (0 on the CPU); save: of a forward\n"
      "that keeps its intermediates, or of the backward that reads them.");

  m.def(
      "saved_workspace_bytes",
      [](std::int64_t B, std::int64_t T, std::int64_t HK, std::int64_t HV, std::int64_t K,
         std::int64_t V, const std::string& dtype, const std::string& beta_dtype,
         bool initial_state, std::int64_t sequences) -> std::size_t {
#ifdef GDN_PYTHON_CUDA
        // Shapes alone (no data is read without cu_seqlens): any non-null address will do.
        void* const shape_only = reinterpret_cast<void*>(std::uintptr_t{256});
        const gdn::DType dt = dtype_named(dtype);
        gdn::DeltaRuleInputs in;
        in.q = {shape_only, dt, {B, T, HK, K}};
        in.k = {shape_only, dt, {B, T, HK, K}};
        in.v = {shape_only, dt, {B, T, HV, V}};
        in.g = {shape_only, gdn::DType::f32, {B, T, HV}};
        in.beta = {shape_only, dtype_named(beta_dtype), {B, T, HV}};
        const std::int64_t N = sequences > 0 ? sequences : B;
        if (sequences > 0) in.cu_seqlens = {shape_only, gdn::DType::i64, {N + 1}};
        if (initial_state) in.initial_state = {shape_only, gdn::DType::f32, {N, HV, K, V}};
        return gdn::delta_rule_forward_cuda_workspace(in, {}, true);
#else
        (void)B, (void)T, (void)HK, (void)HV, (void)K, (void)V, (void)dtype, (void)beta_dtype,
            (void)initial_state, (void)sequences;
        no_cuda();
#endif
      },
      nb::arg("B"), nb::arg("T"), nb::arg("HK"), nb::arg("HV"), nb::arg("K"), nb::arg("V"),
      nb::arg("dtype"), nb::arg("beta_dtype"), nb::arg("initial_state"), nb::arg("sequences"),
      "Workspace bytes of a saving forward on CUDA from shapes alone (sequences: N with\n"
      "cu_seqlens, 0 without).");

  m.def(
      "forward",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
         const Optional& initial_state, const Optional& cu_seqlens, const Array& o,
         const Optional& final_state, double scale, bool use_qk_l2norm, const std::string& method,
         std::uintptr_t stream, const Optional& workspace, const Optional& cu_seqlens_host,
         bool save) {
        const gdn::DeltaRuleInputs in =
            inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm);
        const gdn::DeltaRuleOutputs out{ref(o, "o"), ref(final_state, "final_state")};
        const Optional o_opt = o;
        if (!on_cuda(q, {{&initial_state, "initial_state"},
                         {&cu_seqlens, "cu_seqlens"},
                         {&o_opt, "o"},
                         {&final_state, "final_state"}})) {
          nb::gil_scoped_release release;
          gdn::delta_rule_forward(in, out, method_of(method));
          return;
        }
#ifdef GDN_PYTHON_CUDA
        gdn::delta_rule_forward_cuda(in, out,
                                     context(stream, workspace, cu_seqlens_host, save, {}));
#else
        (void)stream, (void)workspace, (void)cu_seqlens_host, (void)save;
        no_cuda();
#endif
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("o"),
      nb::arg("final_state").none(), nb::arg("scale"), nb::arg("use_qk_l2norm"), nb::arg("method"),
      nb::arg("stream"), nb::arg("workspace").none(), nb::arg("cu_seqlens_host").none(),
      nb::arg("save"),
      "o (and final_state) from the inputs, written into the given tensors; save: keep the\n"
      "intermediates in the workspace for the backward (CUDA).");

  m.def(
      "backward",
      [](const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta,
         const Optional& initial_state, const Optional& cu_seqlens, const Array& d_o,
         const Optional& d_final_state, const Array& dq, const Array& dk, const Array& dv,
         const Array& dg, const Array& dbeta, const Optional& dh0, double scale, bool use_qk_l2norm,
         const std::string& method, std::uintptr_t stream, const Optional& workspace,
         const Optional& cu_seqlens_host, const Optional& forward_workspace) {
        const gdn::DeltaRuleInputs in =
            inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm);
        const gdn::DeltaRuleGrads grads{ref(d_o, "d_o"),     ref(d_final_state, "d_final_state"),
                                        ref(dq, "dq"),       ref(dk, "dk"),
                                        ref(dv, "dv"),       ref(dg, "dg"),
                                        ref(dbeta, "dbeta"), ref(dh0, "dh0")};
        const Optional d_o_opt = d_o;
        if (!on_cuda(q, {{&initial_state, "initial_state"},
                         {&cu_seqlens, "cu_seqlens"},
                         {&d_o_opt, "d_o"},
                         {&d_final_state, "d_final_state"}})) {
          nb::gil_scoped_release release;
          gdn::delta_rule_backward(in, grads, method_of(method));
          return;
        }
#ifdef GDN_PYTHON_CUDA
        gdn::delta_rule_backward_cuda(in, grads,
                                      context(stream, workspace, cu_seqlens_host,
                                              forward_workspace.has_value(), forward_workspace));
#else
        (void)stream, (void)workspace, (void)cu_seqlens_host, (void)forward_workspace;
        no_cuda();
#endif
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
      nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("d_o"),
      nb::arg("d_final_state").none(), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dg"),
      nb::arg("dbeta"), nb::arg("dh0").none(), nb::arg("scale"), nb::arg("use_qk_l2norm"),
      nb::arg("method"), nb::arg("stream"), nb::arg("workspace").none(),
      nb::arg("cu_seqlens_host").none(), nb::arg("forward_workspace").none(),
      "Every gradient, written into the given tensors; forward_workspace: a saving forward's, "
      "read\n"
      "instead of recomputing (CUDA).");

  nb::class_<Comm>(m, "Communicator",
                   "The ranks of one context-parallel group (gdn/communicator.h): host memory\n"
                   "(virtual CPU ranks) or device memory (NCCL, virtual ranks on one GPU), where\n"
                   "every call is ordered on `stream` without host synchronization.")
      .def_prop_ro("rank", [](const Comm& c) { return c.get().rank(); })
      .def_prop_ro("size", [](const Comm& c) { return c.get().size(); })
      .def_prop_ro(
          "device",
          [](const Comm& c) { return c.get().memory() == gdn::Memory::device ? "cuda" : "cpu"; })
      .def_prop_ro(
          "stream",
          [](const Comm& c) { return reinterpret_cast<std::uintptr_t>(c.get().stream()); },
          "The CUDA stream (as an integer) that orders a device communicator's calls; 0 on host.")
      .def_prop_ro("bytes_sent", [](const Comm& c) { return c.get().bytes_sent(); })
      .def(
          "send",
          [](const Comm& c, const Array& data, int peer) {
            c.check(data, "data");
            nb::gil_scoped_release release;
            c.get().send(data.data(), data.nbytes(), peer);
          },
          nb::arg("data"), nb::arg("peer"))
      .def(
          "recv",
          [](const Comm& c, const Array& data, int peer) {
            c.check(data, "data");
            nb::gil_scoped_release release;
            c.get().recv(data.data(), data.nbytes(), peer);
          },
          nb::arg("data"), nb::arg("peer"))
      .def(
          "send_recv",
          [](const Comm& c, const Array& send, int to, const Array& recv, int from) {
            c.check(send, "send");
            c.check(recv, "recv");
            nb::gil_scoped_release release;
            c.get().send_recv(send.data(), send.nbytes(), to, recv.data(), recv.nbytes(), from);
          },
          nb::arg("send"), nb::arg("to"), nb::arg("recv"), nb::arg("from_"),
          "Sends to one peer and receives from another at once.")
      .def(
          "synchronize",
          [](const Comm& c) {
            nb::gil_scoped_release release;
            c.get().synchronize();
          },
          "Waits for every call so far; raises if one failed or a peer timed out.");

  m.def(
      "strategy_names",
      [] {
        std::vector<std::string> names;
        for (gdn::Strategy s : gdn::all_strategies()) names.emplace_back(gdn::strategy_name(s));
        return names;
      },
      "The context-parallel strategies (besides \"auto\").");

  m.def("run_virtual_ranks", &run_virtual_ranks, nb::arg("ranks"), nb::arg("device"), nb::arg("fn"),
        nb::arg("timeout"),
        "fn(communicator) on `ranks` threads of this process (CPU: host memory; CUDA: ranks\n"
        "sharing the current GPU); returns each rank's result in rank order.");

#ifdef GDN_PYTHON_CUDA
  m.def(
      "nccl_unique_id", [] { return nb::bytes(gdn::nccl_unique_id().data(), 128); },
      "A fresh NCCL unique id (128 bytes) for nccl_communicator.");
  m.def(
      "nccl_communicator",
      [](nb::bytes unique_id, int rank, int ranks, int device, double timeout) {
        auto state = std::make_shared<CommState>();
        const std::string id(unique_id.c_str(), unique_id.size());
        {
          nb::gil_scoped_release release;
          state->owned = gdn::nccl_communicator(id, rank, ranks, device, timeout_of(timeout));
        }
        state->comm = state->owned.get();
        return Comm(state);
      },
      nb::arg("unique_id"), nb::arg("rank"), nb::arg("ranks"), nb::arg("device"),
      nb::arg("timeout"),
      "Rank `rank` of a NCCL group on `device`; every rank calls it with rank 0's id.");
#endif

  nb::class_<CpOp>(m, "CpOp", "One rank's side of the context-parallel op (gdn::CpDeltaRule).")
      .def(nb::init<const Comm&, const std::string&, bool>(), nb::arg("comm"), nb::arg("strategy"),
           nb::arg("save_for_backward"))
      .def(
          "forward",
          [](CpOp& op, const Array& q, const Array& k, const Array& v, const Array& g,
             const Array& beta, const Optional& initial_state, const Optional& cu_seqlens,
             const Array& o, const Optional& final_state, double scale, bool use_qk_l2norm) {
            op.forward(inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm),
                       {ref(o, "o"), ref(final_state, "final_state")});
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
          nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("o"),
          nb::arg("final_state").none(), nb::arg("scale"), nb::arg("use_qk_l2norm"),
          "This rank's o (and its rows of final_state) from its shard.")
      .def(
          "backward",
          [](CpOp& op, const Array& q, const Array& k, const Array& v, const Array& g,
             const Array& beta, const Optional& initial_state, const Optional& cu_seqlens,
             const Array& d_o, const Optional& d_final_state, const Array& dq, const Array& dk,
             const Array& dv, const Array& dg, const Array& dbeta, const Optional& dh0,
             double scale, bool use_qk_l2norm) {
            op.backward(
                inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm),
                {ref(d_o, "d_o"), ref(d_final_state, "d_final_state"), ref(dq, "dq"), ref(dk, "dk"),
                 ref(dv, "dv"), ref(dg, "dg"), ref(dbeta, "dbeta"), ref(dh0, "dh0")});
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
          nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("d_o"),
          nb::arg("d_final_state").none(), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
          nb::arg("dg"), nb::arg("dbeta"), nb::arg("dh0").none(), nb::arg("scale"),
          nb::arg("use_qk_l2norm"), "This rank's gradients; call after forward on the same shard.")
      .def_prop_ro("strategy", &CpOp::strategy, "The strategy used (auto resolved at forward).");
}
