"""A training script written the way Horovod's PyTorch docs show it; the only change is the import line
(`import horovod.torch as hvd` -> `import gradcomp.torch as hvd`). Run under mpirun; exits non-zero if training did
not work (the checks at the end are the test's, not part of the recipe).

    mpirun -np 4 python tests/python/horovod_style_train.py [--compression topk] [--epochs 3]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import gradcomp.torch as hvd

parser = argparse.ArgumentParser(description="Horovod-style synthetic classification")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--compression", default="none", help="none, fp16, topk, ... or a spec string")
parser.add_argument("--batches-per-allreduce", type=int, default=1)
args = parser.parse_args()

# Initialize Horovod
hvd.init()
torch.manual_seed(42 + hvd.rank())  # different initial weights per rank: broadcast_parameters must fix that
torch.set_num_threads(1)

# A synthetic dataset: a linear teacher with noise, 10 classes.
g = torch.Generator().manual_seed(0)
x_all = torch.randn(2048, 20, generator=g)
teacher = torch.randn(20, 10, generator=g)
y_all = (x_all @ teacher).argmax(dim=1)
train_dataset = torch.utils.data.TensorDataset(x_all, y_all)

# Partition dataset among workers using DistributedSampler
train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(),
                                                                rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

# Horovod: scale learning rate by the number of GPUs.
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)

# Horovod: (optional) compression algorithm. ("pyhalf": the tests' Python-registered float16 codec.)
if args.compression == "pyhalf":
    import helpers
    helpers.register_python_codec()
compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16, "topk": hvd.Compression.topk(0.1),
               "dgc": hvd.Compression.dgc, "qsgd": hvd.Compression.qsgd}.get(args.compression, args.compression)

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                     backward_passes_per_step=args.batches_per_allreduce, op=hvd.Average)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


losses = []
for epoch in range(args.epochs):
    model.train()
    train_sampler.set_epoch(epoch)
    total = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    losses.append(metric_average(total / len(train_loader), "avg_loss"))
    if hvd.rank() == 0:
        print(f"epoch {epoch}: loss {losses[-1]:.4f} ({args.compression}, {hvd.size()} ranks)", flush=True)

# ---- the test's checks -------------------------------------------------------------------------------------------
flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
root = hvd.broadcast(flat, root_rank=0, name="check")
ok = True
if not torch.equal(root, flat):
    print(f"rank {hvd.rank()}: parameters differ from rank 0 by {float((root - flat).abs().max())}", flush=True)
    ok = False
if not losses[-1] < 0.7 * losses[0]:
    print(f"rank {hvd.rank()}: loss did not decrease enough: {losses}", flush=True)
    ok = False
if len(set(hvd.allgather_object(losses[-1]))) != 1:  # metric_average: the same value on every rank
    print(f"rank {hvd.rank()}: the averaged losses differ across ranks: {hvd.allgather_object(losses[-1])}", flush=True)
    ok = False
# One step of known result through the same compression: a fresh DistributedOptimizer (its own codec state) on a
# 10x10 weight whose gradient on rank r is (r + 1) * G, G = 2 e_0 b^T with b of +-1, +-0.5: 10 non-zeros (what topk
# at ratio 0.1 keeps), rank one (what powersgd reconstructs), dyadic (exact in float16). SGD with lr 1 must move the
# weight by exactly mean(r + 1) * G (powersgd: within 1e-5 of its largest value): a halved or dropped sum fails.
known = torch.nn.Linear(10, 10, bias=False)
hvd.broadcast_parameters(known.state_dict(), root_rank=0)
known_opt = hvd.DistributedOptimizer(optim.SGD(known.parameters(), lr=1.0),
                                     named_parameters=[("known.weight", known.weight)], compression=compression)
G = torch.zeros(10, 10)
G[0] = 2 * torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -0.5, 0.5, -1.0, 1.0])
before = known.weight.detach().clone()
known_opt.zero_grad()
(known.weight * ((hvd.rank() + 1) * G)).sum().backward()
known_opt.step()
want = before - (hvd.size() + 1) / 2 * G
err = float((known.weight.detach() - want).abs().max())
allowed = 1e-5 * float(G.abs().max()) if "powersgd" in str(args.compression) else 0.0
if not err <= allowed:
    print(f"rank {hvd.rank()}: a known step ({args.compression}) is off by {err:.3g} (allowed {allowed:g})",
          flush=True)
    ok = False
# Sum and Average through the backend's compressed path (a spec string takes it; Compression.none is the plain
# allreduce): dyadic values, exact in any summation order, and a subnormal that an average scaled back by the world
# size (how the runtime backend once faked Sum) flushes to zero.
tiny = float.fromhex("0x1p-149")
mine = torch.tensor([0.25 * (hvd.rank() + 1), -3.0, tiny])
n = hvd.size()
got_sum = hvd.allreduce(mine, op=hvd.Sum, name="check.sum", compression="none")
got_avg = hvd.allreduce(mine, op=hvd.Average, name="check.average", compression="none")
if not torch.equal(got_sum, torch.tensor([0.125 * n * (n + 1), -3.0 * n, tiny * n])):
    print(f"rank {hvd.rank()}: Sum gave {got_sum.tolist()}", flush=True)
    ok = False
if not torch.equal(got_avg[:2], torch.tensor([0.125 * (n + 1), -3.0])):
    print(f"rank {hvd.rank()}: Average gave {got_avg.tolist()}", flush=True)
    ok = False
if args.compression == "pyhalf" and helpers.HalfPrecision.calls == 0:
    print(f"rank {hvd.rank()}: the Python codec was never called", flush=True)
    ok = False
sys.exit(0 if ok else 1)
