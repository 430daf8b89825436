# extract.cmake - turns a CUDA source of the backend into C++ that the host
# emulation (cuda_emu.h) compiles, so that test_cuda_emu always tests the
# current kernels, never a copy. Run at build time:
#   cmake -DSRC=.../cuda_kernels.cu -DOUT=.../cuda_kernels.inc -P extract.cmake
#
# The result is included by test_cuda_emu.cpp inside namespace emu. It keeps
# the source's lines where they were (#line points compiler errors and
# sanitizer reports at the .cu file) and changes only what C++ cannot take:
#   - #include lines are emptied: the test includes the backend's headers and
#     the emulation's CUDA definitions itself, outside the namespace;
#   - extern "C" is dropped: the launchers become emu::tcu_*, C++ functions
#     that cannot clash with the real ones of a CUDA build of libtide
#     (-DKEEP_C=ON keeps it: the emulated CUDA runtime's library, which has
#     no real ones, exports the launchers to the backend's C code);
#   - k<<<grid, block, smem, stream>>>(args) becomes
#     emu_launch<&k>(emu_cfg(grid, block, smem, stream), args);
#   - extern __shared__ T name[]; becomes a pointer to the launch's dynamic
#     shared memory, and __shared__ T name[N]; a function static (one block
#     runs at a time) followed by emu_shared(), which refills it with 0xff
#     bytes for every new block;
#   - #define X_MAX_GRID v becomes emu_grid_cap(v): the test lowers the cap
#     in some runs so that grid-stride loops go round more than once at test
#     sizes (results must not depend on it).
# It also appends the list of the file's __global__ kernels, so the test can
# fail when a kernel is never launched by any of its cases.
# Anything it does not recognise (another form of __shared__ or of launch)
# is an error here rather than a silent gap.

if(NOT SRC OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DSRC=file.cu -DOUT=file.inc -P extract.cmake")
endif()
file(READ "${SRC}" text)
get_filename_component(stem "${SRC}" NAME_WE)
string(MAKE_C_IDENTIFIER "${stem}" stem)

# The kernels, from the unmodified text.
set(name "[A-Za-z_][A-Za-z0-9_]*")
set(ws "[ \t\n]")
string(REGEX MATCHALL "__global__${ws}+void${ws}+(__launch_bounds__\\([^)]*\\)${ws}+)?${name}\\("
       decls "${text}")
set(kernels "")
foreach(d IN LISTS decls)
  string(REGEX REPLACE ".*[ \t\n](${name})\\($" "\\1" k "${d}")
  list(APPEND kernels "${k}")
endforeach()
list(REMOVE_DUPLICATES kernels)
if(NOT kernels)
  message(FATAL_ERROR "${SRC}: no __global__ kernel found")
endif()

# Includes (the first line included), keeping the line count.
string(REGEX REPLACE "(^|\n)#[ \t]*include[^\n]*" "\\1" text "${text}")
if(NOT KEEP_C)
  string(REPLACE "extern \"C\" " "" text "${text}")
endif()

# Grid caps.
string(REGEX REPLACE "#define (${name}_MAX_GRID)[ \t]+([^\n]*)" "#define \\1 emu_grid_cap(\\2)" text "${text}")

# Shared memory: dynamic, then static (arrays or scalars).
string(REGEX REPLACE "extern[ \t]+__shared__[ \t]+([A-Za-z0-9_: ]*[A-Za-z0-9_])[ \t]+(${name})[ \t]*\\[\\][ \t]*;"
       "\\1 *\\2 = (\\1 *)emu_dyn_smem();" text "${text}")
string(REGEX REPLACE "__shared__[ \t]+([A-Za-z0-9_: ]*[A-Za-z0-9_])[ \t]+(${name})[ \t]*((\\[[^;\n]*\\])?)[ \t]*;"
       "static \\1 \\2\\3; emu_shared(&\\2, sizeof \\2);" text "${text}")

# Launches, with and without arguments.
set(kname "${name}(<[^<>;\n]*>)?")
string(REGEX REPLACE "(${kname})<<<([^\n]*)>>>\\([ \t]*\\)" "emu_launch<&\\1>(emu_cfg(\\3))" text "${text}")
string(REGEX REPLACE "(${kname})<<<([^\n]*)>>>\\(" "emu_launch<&\\1>(emu_cfg(\\3), " text "${text}")

foreach(left "<<<" "__shared__")
  string(FIND "${text}" "${left}" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${text}" ${at} 120 ctx)
    message(FATAL_ERROR "${SRC}: a form of ${left} that extract.cmake does not rewrite: ${ctx}")
  endif()
endforeach()

set(list "")
foreach(k IN LISTS kernels)
  string(APPEND list "\"${k}\", ")
endforeach()
set(out "/* Generated from ${SRC} by tests/emu/extract.cmake: do not edit. */\n#line 1 \"${SRC}\"\n${text}")
string(APPEND out "\n#line 1 \"${OUT}\"\nstatic const char *const emu_kernels_${stem}[] = {${list}nullptr};\n")
file(WRITE "${OUT}" "${out}")
