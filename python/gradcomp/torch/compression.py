"""horovod.torch.compression's names, for scripts that import them from there: the compressor base class
(`Compressor`: compress(tensor) -> (tensor, ctx), decompress(tensor, ctx)), `NoneCompressor`, `FP16Compressor`
and `Compression` (whose `none` / `fp16` are such objects and still gradcomp codec specs; the other gradcomp codecs
are there too, e.g. `Compression.topk(0.01)`)."""
from .._compressors import Compression, FP16Compressor, NoneCompressor
from .._compressors import HorovodCompressor as Compressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
