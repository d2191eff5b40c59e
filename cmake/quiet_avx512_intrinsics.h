// Force-included (-include) into every C++ translation unit of a sanitizer build with GCC < 13
// and -march=native (CMakeLists.txt). Under -fsanitize=address,undefined, GCC 12 warns
// "'__Y' is used uninitialized" inside its own AVX-512 intrinsics (avx512fintrin.h's
// _mm512_undefined_*, which self-initialize on purpose; GCC bug 105593), wherever Eigen's packet
// math inlines them. Including the intrinsics here first, between these pragmas, silences
// -Wuninitialized for locations in GCC's intrinsic headers only: the warning stays on for our
// code (and every other header).
#pragma once
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
