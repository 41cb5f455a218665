// Asio's non-template implementation, compiled once here (BOOST_ASIO_SEPARATE_COMPILATION, set
// on grove_transport for every target that links it) instead of inline in every file that
// includes an Asio header: those files are the slowest to compile of the project.
#include <boost/asio/impl/src.hpp>
