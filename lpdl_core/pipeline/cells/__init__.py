"""What a cell, a table and a grid are: `Cell` and its column roles, the cell tables, extension grids,
the tables' shapes and display names (torch-free)."""
