"""The reduce ops of gradcomp's Horovod-style APIs (gradcomp.torch and gradcomp.tensorflow), as Horovod names them;
the strings are what the C++ collectives and the runtime take."""
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"
