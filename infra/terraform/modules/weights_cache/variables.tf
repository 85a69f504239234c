variable "name" {
  description = "Prefix of the file system and its companions."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,38}$", var.name))
    error_message = "name must be 3-39 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets of the nodes: one mount target in each."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 1 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must be one or more subnet ids (subnet-...)."
  }
}

variable "client_security_group_id" {
  description = "Security group of the EKS nodes, the only NFS clients."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.client_security_group_id))
    error_message = "client_security_group_id must be a security group id (sg-...)."
  }
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k in keys(var.tags) : length(k) > 0])
    error_message = "Tag keys must not be empty."
  }
}
