# The strict-warning header check, run by CTest as a script so that it can use a compiler other than
# the one this build was configured with. With the compiler CXX:
#   1. every public .hpp under INCLUDE/braid (less those matching EXCLUDE), one translation unit each,
#      included twice, compiles with -std=c++20 -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
#      (-Wuseless-cast where USELESS_CAST is set: g++ only) -Werror; with ONE_TU set, all of them in one
#      translation unit instead (each still included twice): the same warnings for a fraction of the
#      compile time, where another compiler's run checks that each header compiles alone;
#   2. so does README.md's example program (the ```cpp block with `int main`), read at test time;
#   3. each of those headers (those matching CXX17_HEADERS where it is set), compiled as C++17, fails
#      with braid's one sentence ("braid needs C++20: ...") and at most two diagnostics (the #error and
#      the fatal include that stops the compiler).
# Everything is -fsyntax-only: nothing is generated but the translation units under WORK.
#
#   cmake -DCXX=g++ -DINCLUDE=<repo>/include -DREADME=<repo>/README.md -DWORK=<dir>
#         [-DUSELESS_CAST=ON] [-DONE_TU=ON] [-DCXX17_HEADERS=<regex>] [-DEXCLUDE=<regex>] [-DEXTRA_INCLUDES=<dir;dir>] -P strict.cmake
cmake_minimum_required(VERSION 3.21)
foreach(v INCLUDE README WORK)
  if(NOT ${v})
    message(FATAL_ERROR "strict.cmake: ${v} is not set")
  endif()
endforeach()
if(NOT CXX)
  message(FATAL_ERROR "strict.cmake: compiler not found (${CXX}); bash scripts/deps.sh installs g++ and clang")
endif()

set(warn -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Werror)
if(USELESS_CAST)
  list(APPEND warn -Wuseless-cast)
endif()
set(inc "-I${INCLUDE}")
foreach(d IN LISTS EXTRA_INCLUDES)
  list(APPEND inc -isystem "${d}")
endforeach()
set(sentence "braid needs C++20: compile with -std=c++20 or later")

file(GLOB_RECURSE headers RELATIVE "${INCLUDE}" "${INCLUDE}/braid/*.hpp")
list(SORT headers)
if(EXCLUDE)
  list(FILTER headers EXCLUDE REGEX "${EXCLUDE}")
endif()
if(NOT headers)
  message(FATAL_ERROR "strict.cmake: no headers under ${INCLUDE}/braid")
endif()

set(failures)
set(n 0)
file(MAKE_DIRECTORY "${WORK}")
# Compiles `tu` as C++20 with the strict warnings; a failure is listed as `what`.
function(strict_compile tu what)
  execute_process(COMMAND "${CXX}" -std=c++20 ${warn} -fsyntax-only ${inc} "${tu}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    set(failures ${failures} "${what} (C++20, strict warnings)" PARENT_SCOPE)
    message("---- ${what} (${tu}): C++20 with strict warnings failed:\n${out}")
  endif()
endfunction()
set(all_text "")
foreach(h IN LISTS headers)
  string(REPLACE "/" "_" stem "${h}")
  set(tu "${WORK}/${stem}.cpp")
  file(WRITE "${tu}" "#include <${h}>\n#include <${h}>\n") # alone, and a second include is harmless
  string(APPEND all_text "#include <${h}>\n#include <${h}>\n")
  if(NOT ONE_TU)
    strict_compile("${tu}" "${h}")
  endif()
  math(EXPR n "${n} + 1")
  if(CXX17_HEADERS AND NOT h MATCHES "${CXX17_HEADERS}")
    continue()
  endif()
  execute_process(COMMAND "${CXX}" -std=c++17 -fsyntax-only ${inc} "${tu}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REGEX MATCHALL "(^|\n)[^\n]*error: " diags "${out}")
  list(LENGTH diags ndiag)
  string(FIND "${out}" "${sentence}" at)
  if(rc EQUAL 0 OR at EQUAL -1 OR ndiag GREATER 2)
    list(APPEND failures "${h} (C++17: want a failure with the one sentence and at most 2 errors; got exit ${rc}, ${ndiag} errors)")
    message("---- ${h}: as C++17:\n${out}")
  endif()
endforeach()
if(ONE_TU)
  file(WRITE "${WORK}/all_headers.cpp" "${all_text}")
  strict_compile("${WORK}/all_headers.cpp" "all ${n} headers in one translation unit")
endif()

# The README's example program, as a user would paste it.
file(READ "${README}" readme)
string(REGEX MATCH "```cpp\n(#include <braid/braid.hpp>[^`]*int main\\(\\)[^`]*)```" found "${readme}")
if(NOT found)
  list(APPEND failures "README example (no ```cpp block with #include <braid/braid.hpp> and int main() in ${README})")
else()
  set(tu "${WORK}/readme_example.cpp")
  file(WRITE "${tu}" "${CMAKE_MATCH_1}")
  strict_compile("${tu}" "README example")
endif()

if(failures)
  list(LENGTH failures nf)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "${nf} failures with ${CXX}:\n  ${text}")
endif()
if(ONE_TU)
  set(how "in one translation unit")
else()
  set(how "each alone")
endif()
message(STATUS "${n} headers (${how}) and the README example compile clean with ${CXX} (${warn}); "
               "as C++17 each checked stops at the one sentence")
