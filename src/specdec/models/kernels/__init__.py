"""The C++ extension (specdec's CPU kernels): its build, which ISA's code runs, the int8 matrix kernel's choice, threads."""
