// Umbrella header: the whole public API of gradcomp.
#pragma once

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "gradcomp/mailbox.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "gradcomp/tensor.h"
