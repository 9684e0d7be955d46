// Kiln's public status header, include/kiln/status.h: the same types inside Kiln.
#pragma once

#include "kiln/status.h"
