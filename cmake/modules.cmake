# cmake/modules.cmake: the module layering, declared and enforced by the build.
# Owns bg_module() (one OBJECT library per folder and what it may use), the
# include folders each module sees, the link check of every module against
# what it declares, and the probes tests/layering uses to show that a
# wrong-way include fails to compile. Must not: name any module's sources or
# external libraries (each folder's CMakeLists.txt does).
#
# bg_module(bg_<folder> SOURCES files... [USES bg_modules...] [DEPS libraries...])
#   USES: the brigade modules this one may use. A module may use what it
#   declares and, through them, what they declare (the table is a DAG:
#   docs/architecture.md draws it); nothing else of the tree.
#   DEPS: external libraries (handed on to users of libbrigade.a by
#   cmake/package.cmake).
#
# Include paths. The source root is on no module's include path: a module
# sees include/ (the public API) and, as "<folder>/...", its own folder and
# those of the modules it may use; each folder is exposed on its own through
# ${PROJECT_BINARY_DIR}/bg_include/<folder>/<folder>, a link to the source
# folder. So kernels/cpu/x.c including "runtime/trace.h" fails: no folder on
# its path has a runtime/ in it.
#
# Calls. A call through a public header (include/brigade/) is not stopped by
# the include paths, so unless BG_FUZZ is on, every module is also linked as a
# shared library with its used modules and -Wl,--no-undefined
# (bg_layering_link_<folder>, part of the build): a call into a module it does
# not use is an undefined symbol there, and the build fails.

# The folder that include paths expose as "<name>/...": its own include root.
function(bg_include_root var name dir)
  set(root ${PROJECT_BINARY_DIR}/bg_include/${name})
  file(MAKE_DIRECTORY ${root})
  if(IS_SYMLINK ${root}/${name})
    file(READ_SYMLINK ${root}/${name} old)
    if(NOT old STREQUAL dir) # the source tree moved
      file(REMOVE ${root}/${name})
    endif()
  endif()
  if(NOT IS_SYMLINK ${root}/${name})
    file(CREATE_LINK ${dir} ${root}/${name} SYMBOLIC)
  endif()
  set(${var} ${root} PARENT_SCOPE)
endfunction()

function(bg_module name)
  cmake_parse_arguments(M "" "" "SOURCES;USES;DEPS" ${ARGN})
  get_filename_component(folder ${CMAKE_CURRENT_SOURCE_DIR} NAME)
  if(NOT name STREQUAL "bg_${folder}")
    message(FATAL_ERROR "bg_module(${name}) in ${folder}/: a module is named bg_<its folder> (bg_${folder})")
  endif()
  foreach(u ${M_USES})
    if(NOT TARGET ${u})
      message(FATAL_ERROR "bg_module(${name}) USES ${u}: no such module yet (the top CMakeLists.txt adds the "
                          "folders bottom-up: a module may only use one below it)")
    endif()
  endforeach()
  add_library(${name} OBJECT ${M_SOURCES})
  bg_include_root(root ${folder} ${CMAKE_CURRENT_SOURCE_DIR})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${root})
  # usage requirements only (include folders, external libraries): object
  # libraries hand on no objects through a link
  target_link_libraries(${name} PUBLIC ${M_USES} ${M_DEPS})
  set_target_properties(${name} PROPERTIES BG_FOLDER ${folder} BG_USES "${M_USES}")
  set_property(GLOBAL APPEND PROPERTY BG_MODULES ${name})
endfunction()

# The modules that @p name may use, itself excluded: its USES and theirs.
function(bg_module_closure var name)
  set(out "")
  set(todo ${name})
  while(todo)
    list(POP_FRONT todo m)
    get_target_property(uses ${m} BG_USES)
    if(NOT uses)
      set(uses "")
    endif()
    foreach(u ${uses})
      if(NOT u IN_LIST out)
        list(APPEND out ${u})
        list(APPEND todo ${u})
      endif()
    endforeach()
  endwhile()
  set(${var} ${out} PARENT_SCOPE)
endfunction()

# bg_layering_link(TARGET module [EXTRA sources...]): a shared library of
# @p module's objects, those of the modules it may use and @p EXTRA (compiled
# as the module's sources are), linked with --no-undefined against their
# external libraries. Without EXTRA it is part of the build.
function(bg_layering_link target m)
  cmake_parse_arguments(L "" "" "EXTRA" ${ARGN})
  bg_module_closure(uses ${m})
  set(objects "")
  set(libs "")
  foreach(u ${m} ${uses})
    list(APPEND objects $<TARGET_OBJECTS:${u}>)
    get_target_property(deps ${u} INTERFACE_LINK_LIBRARIES)
    if(deps)
      list(APPEND libs ${deps})
    endif()
  endforeach()
  list(FILTER libs EXCLUDE REGEX "^bg_")
  list(REMOVE_DUPLICATES libs)
  if(L_EXTRA)
    add_library(${target} SHARED EXCLUDE_FROM_ALL ${objects} ${L_EXTRA})
    target_include_directories(${target} PRIVATE $<TARGET_PROPERTY:${m},INCLUDE_DIRECTORIES>
                               $<TARGET_PROPERTY:${m},INTERFACE_INCLUDE_DIRECTORIES>)
    target_compile_definitions(${target} PRIVATE $<TARGET_PROPERTY:${m},COMPILE_DEFINITIONS>)
  else()
    add_library(${target} SHARED ${objects})
  endif()
  target_link_libraries(${target} PRIVATE ${libs})
  target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/layering)
endfunction()

# Every module's link check: bg_layering_link_<folder>, part of the build.
function(bg_layering_link_checks)
  get_property(modules GLOBAL PROPERTY BG_MODULES)
  foreach(m ${modules})
    get_target_property(folder ${m} BG_FOLDER)
    bg_layering_link(bg_layering_link_${folder} ${m})
  endforeach()
endfunction()

# tests/layering: for every module M (and every target in TARGETS, such as
# the CLI, with BG_FOLDER and BG_USES set and its include paths its own) and
# every other one N that has a header in its folder, an object library
# compiled as M's sources are (M's include paths and definitions) from one
# file that includes N's first header: bg_layering_probe_<M>_<N>. The lines
# "<probe target> <allowed 0|1> <header>" go to @p file. Not part of the build
# (EXCLUDE_FROM_ALL): the test builds them and expects exactly the forbidden
# ones to fail, each on its include.
function(bg_layering_probes file)
  cmake_parse_arguments(P "" "" "TARGETS" ${ARGN})
  get_property(modules GLOBAL PROPERTY BG_MODULES)
  list(APPEND modules ${P_TARGETS})
  set(table "")
  set(probe_dir ${CMAKE_CURRENT_BINARY_DIR}/probes)
  foreach(n ${modules})
    get_target_property(nf ${n} BG_FOLDER)
    get_target_property(nsrc ${n} SOURCE_DIR)
    file(GLOB headers RELATIVE ${nsrc} ${nsrc}/*.h)
    list(SORT headers)
    if(headers)
      list(GET headers 0 h)
      set(header_${nf} "${nf}/${h}")
    endif()
  endforeach()
  foreach(m ${modules})
    get_target_property(mf ${m} BG_FOLDER)
    get_target_property(mtype ${m} TYPE)
    bg_module_closure(allowed ${m})
    foreach(n ${modules})
      get_target_property(nf ${n} BG_FOLDER)
      if(n STREQUAL m OR NOT DEFINED header_${nf})
        continue()
      endif()
      set(ok 0)
      if(n IN_LIST allowed)
        set(ok 1)
      endif()
      set(probe bg_layering_probe_${mf}_${nf})
      set(src ${probe_dir}/${mf}_includes_${nf}.c)
      file(CONFIGURE OUTPUT ${src} CONTENT
           "/* generated by cmake/modules.cmake: a ${mf}/ source that includes a header of ${nf}/ */\n#include \"${header_${nf}}\"\nint ${probe};\n")
      add_library(${probe} OBJECT EXCLUDE_FROM_ALL ${src})
      # exactly what M's own sources get: its include paths (its own and, for
      # a module, those its link hands on) and its definitions
      target_include_directories(${probe} PRIVATE $<TARGET_PROPERTY:${m},INCLUDE_DIRECTORIES>)
      target_compile_definitions(${probe} PRIVATE $<TARGET_PROPERTY:${m},COMPILE_DEFINITIONS>)
      if(mtype STREQUAL "OBJECT_LIBRARY")
        target_link_libraries(${probe} PRIVATE ${m})
      endif()
      string(APPEND table "${probe} ${ok} ${header_${nf}}\n")
    endforeach()
  endforeach()
  file(WRITE ${file} "${table}")
endfunction()
