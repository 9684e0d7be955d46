// Kiln's public dtype header, include/kiln/dtype.h: the same types inside Kiln.
#pragma once

#include "kiln/dtype.h"
