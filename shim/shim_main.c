/* shim_main: placeholder */
