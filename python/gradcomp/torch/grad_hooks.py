"""Calling back when a parameter's gradient is ready, on torch 1.13 and 2.x: DistributedOptimizer launches a
gradient's allreduce there, CompressedAdam its momentum's."""
import weakref


def register(params, on_grad):
    """Calls on_grad(p) each time the gradient of p (each of `params` that requires one) has been accumulated into
    p.grad during backward. Returns (handles, accumulators): remove() the handles to stop; keep the accumulators
    alive as long as the hooks (torch 1.13 has no post-accumulate hook, so the hook sits on the gradient accumulator
    node, which lives only while something references it).

    A bound method `on_grad` is held weakly: a hook holding its optimizer strongly made a cycle through torch's C++
    hook tables that the garbage collector cannot see (parameter -> hook -> optimizer -> parameter), which kept the
    optimizer and its compressor alive to interpreter exit (nanobind's "leaked instance" report on torch 2.x). A
    parameter whose optimizer is gone is no longer exchanged."""
    ref = weakref.WeakMethod(on_grad) if hasattr(on_grad, "__self__") else (lambda: on_grad)

    def call(p):
        fn = ref()
        if fn is not None:
            fn(p)

    handles, accumulators = [], []
    for p in params:
        if not p.requires_grad:
            continue
        if hasattr(p, "register_post_accumulate_grad_hook"):
            handles.append(p.register_post_accumulate_grad_hook(call))
        else:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            handles.append(acc.register_hook(lambda *_, p=p: call(p)))
            accumulators.append(acc)
    return handles, accumulators
