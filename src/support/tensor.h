// Kiln's public tensor header, include/kiln/tensor.h: the same types inside Kiln.
#pragma once

#include "kiln/tensor.h"
