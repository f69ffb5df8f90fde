pub mod datapath;
