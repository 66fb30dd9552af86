// The translation unit each precompiled header is made from
// (cmake/ShardlineHelpers.cmake: shardline_precompiled_header).
